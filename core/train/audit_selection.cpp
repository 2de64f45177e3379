// The audited elements (audit_selection.hpp).
#include "core/train/audit_selection.hpp"

#include <algorithm>
#include <set>

#include "core/init.hpp"

namespace tandem {

std::vector<std::int64_t> audit_elements(const ModelLayout& layout, std::int64_t count,
                                         std::uint64_t seed) {
  std::vector<std::vector<std::int64_t>> groups(2);  // tensor indices: decay, no_decay
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    const auto group = layout.tensors[i].decay_group == DecayGroup::decay ? 0 : 1;
    groups[static_cast<std::size_t>(group)].push_back(static_cast<std::int64_t>(i));
  }
  // A stream of its own, distinct from the init streams by its name.
  const std::uint64_t stream = init_tensor_stream(seed, "audit-params");
  std::set<std::int64_t> chosen;
  std::uint64_t counter = 0;
  const auto group_count = std::count_if(groups.begin(), groups.end(),
                                         [](const auto& group) { return !group.empty(); });
  const std::int64_t wanted = std::min(count, layout.total_elements);
  for (std::int64_t attempt = 0; static_cast<std::int64_t>(chosen.size()) < wanted; ++attempt) {
    const auto& group = groups[static_cast<std::size_t>(attempt % 2)];
    if (group.empty()) {
      if (group_count == 0) break;
      continue;
    }
    const std::uint64_t word_tensor = init_stream_word(stream, counter++);
    const std::uint64_t word_element = init_stream_word(stream, counter++);
    const auto& tensor = layout.tensor(group[word_tensor % group.size()]);
    chosen.insert(tensor.offset +
                  static_cast<std::int64_t>(word_element % static_cast<std::uint64_t>(tensor.numel)));
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace tandem
