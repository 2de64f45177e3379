// `tandem data inspect` (docs/DATA.md section 14): one training sample as text a
// person can read: its tokens decoded, where its documents begin and end, and per position the
// input, the label, the loss mask, the RoPE position and the attention span, each with why a
// position does not count. It only prints: the masks and positions are the Sample the trainers
// read (build_sample, SPEC 3), never recomputed here.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/config.hpp"
#include "core/data/sample.hpp"

namespace tandem::data {

// What the text names besides the sample itself.
struct InspectContext {
  std::string source;         // "/data/web, train part" (where the sample comes from)
  TokenizerConfig tokenizer;  // names EOD and PAD, and decodes the tokens where it can
  std::int64_t vocab_size = kByteVocabularySize;
  bool reset_position_ids = true;    // the run's SPEC 3 flags, printed so the columns can be read
  bool reset_attention_mask = true;
  bool eod_mask_loss = true;
};

// The text of `sample`, built from `window` (its L + 1 tokens: inputs, then the last label).
// Tokens print as text for the byte tokenizer, GPT2BPETokenizer (--vocab-file) and a byte-level
// HuggingFaceTokenizer (tokenizer.json's ByteLevel decoder); as ids otherwise, and the text says
// so. Decoding maps each id to its bytes; no merges, normalizers or special rules are applied.
std::string describe_sample(const Sample& sample, std::span<const std::int32_t> window,
                            const InspectContext& context);

}  // namespace tandem::data
