// The shared sample check (sample.hpp).
#include "core/data/sample.hpp"

#include <stdexcept>

namespace tandem {

void validate_sample(const Sample& sample, std::int64_t vocab,
                     std::optional<std::int64_t> seq_length, const std::string& who) {
  const auto require = [&who](bool holds, const std::string& message) {
    if (!holds) throw std::invalid_argument(who + ": " + message);
  };
  const std::string name = "sample " + std::to_string(sample.global_index);
  const std::size_t seq =
      seq_length ? static_cast<std::size_t>(*seq_length) : sample.tokens.size();
  require(seq >= 1, name + " has no tokens");
  require(sample.tokens.size() == seq && sample.labels.size() == seq &&
              sample.loss_mask.size() == seq && sample.positions.size() == seq &&
              sample.attention_start.size() == seq,
          name + ": tokens, labels, loss_mask, positions and attention_start must all have " +
              std::to_string(seq) + " entries" + (seq_length ? " (--seq-length)" : ""));
  for (std::size_t t = 0; t < seq; ++t) {
    const std::string where = name + " position " + std::to_string(t) + ": ";
    require(sample.tokens[t] >= 0 && sample.tokens[t] < vocab,
            where + "token " + std::to_string(sample.tokens[t]) + " is outside [0, " +
                std::to_string(vocab) + ")");
    require(sample.labels[t] >= 0 && sample.labels[t] < vocab,
            where + "label " + std::to_string(sample.labels[t]) + " is outside [0, " +
                std::to_string(vocab) + ")");
    require(sample.loss_mask[t] <= 1, where + "loss_mask must be 0 or 1");
    require(sample.attention_start[t] >= 0 &&
                static_cast<std::size_t>(sample.attention_start[t]) <= t,
            where + "attention_start " + std::to_string(sample.attention_start[t]) +
                " must lie in [0, " + std::to_string(t) + "] (SPEC 3)");
  }
}

}  // namespace tandem
