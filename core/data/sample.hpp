// One training sample as both twins consume it: inputs, labels, loss mask, positions and the
// attention span of every position (SPEC 2, 3). Built by core/data (packing), read by the models.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct Sample {
  std::int64_t global_index = 0;          // index in the training sample order (SPEC 2)
  std::vector<std::int32_t> tokens;       // [seq] input ids
  std::vector<std::int32_t> labels;       // [seq] target ids (the next token)
  std::vector<std::uint8_t> loss_mask;    // [seq] 1 where the CE counts (SPEC 3)
  std::vector<std::int32_t> positions;    // [seq] RoPE positions (reset after EOD, SPEC 3)
  // [seq] Position t attends to s iff attention_start[t] <= s <= t (SPEC 3): the first position
  // of t's document (0 when --no-reset-attention-mask). A PAD position attends only to itself
  // (attention_start[t] = t) and, being last in its window, nothing attends to it.
  std::vector<std::int32_t> attention_start;

  std::int64_t input_tokens = 0;  // non-PAD input positions (SPEC 1)
  std::int64_t loss_tokens = 0;   // positions with loss mask 1
  std::int64_t pad_tokens = 0;    // PAD input positions
};

// Checks what a model needs of a sample before it reads one: every field has the same length
// (`seq_length` when given, else at least 1), tokens and labels lie in [0, vocab), the loss mask is
// 0 or 1, and attention_start[t] lies in [0, t] (SPEC 3). Throws std::invalid_argument starting
// with `who` and naming the sample and position.
void validate_sample(const Sample& sample, std::int64_t vocab,
                     std::optional<std::int64_t> seq_length, const std::string& who);

}  // namespace tandem
