// --data-path parsing and the blending index (see blend.hpp for the rule).
#include "core/data/blend.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "core/config_issue.hpp"

namespace tandem::data {
namespace {

constexpr const char* kField = "--data-path";
constexpr const char* kFormsFix =
    "give one PREFIX, weight-prefix pairs W1 P1 W2 P2 ... (e.g. 0.3 /data/web 0.7 /data/code), "
    "or prefixes alone P1 P2 ... to weight each by its size";

std::string trimmed(const std::string& value) {
  const auto is_space = [](unsigned char c) { return std::isspace(c) != 0; };
  const auto first = std::find_if_not(value.begin(), value.end(), is_space);
  const auto last = std::find_if_not(value.rbegin(), value.rend(), is_space).base();
  return first < last ? std::string(first, last) : std::string();
}

// The value as a number when std::strtod reads all of it (Python's float() reads the same
// decimal forms, inf and nan included; that is how Megatron tells weights from prefixes).
std::optional<double> as_number(const std::string& value) {
  const std::string text = trimmed(value);
  if (text.empty()) return std::nullopt;
  char* parsed_end = nullptr;
  const double number = std::strtod(text.c_str(), &parsed_end);
  if (parsed_end != text.c_str() + text.size()) return std::nullopt;
  return number;
}

std::string joined(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& value : values) out += (out.empty() ? "" : " ") + value;
  return out;
}

// "value 3 of 4" (1-based, as a user counts them on the command line).
std::string position_of(std::size_t index, std::size_t count) {
  return "value " + std::to_string(index + 1) + " of " + std::to_string(count);
}

std::string checked_prefix(const std::vector<std::string>& values, std::size_t index,
                           std::vector<ConfigIssue>& issues) {
  const std::string prefix = trimmed(values[index]);  // Megatron strips prefixes
  if (prefix.empty()) {
    issues.push_back({kField, "\"" + values[index] + "\"",
                      position_of(index, values.size()) + " is an empty prefix",
                      "name the dataset's PREFIX (PREFIX.bin / PREFIX.idx)"});
  } else if (as_number(prefix) && values.size() > 1) {
    issues.push_back({kField, values[index],
                      position_of(index, values.size()) +
                          " stands where a prefix belongs but is a number (values alternate "
                          "weight, prefix: W1 P1 W2 P2 ...)",
                      kFormsFix});
  } else if (as_number(prefix)) {
    issues.push_back({kField, values[index], "is a number, a weight without its prefix", kFormsFix});
  }
  return prefix;
}

}  // namespace

std::vector<DataPathEntry> parse_data_path(const std::vector<std::string>& values) {
  std::vector<DataPathEntry> entries;
  std::vector<ConfigIssue> issues;
  const std::size_t count = values.size();
  std::size_t numbers = 0;
  for (const auto& value : values) numbers += as_number(value) ? 1 : 0;

  if (numbers == 0 || count == 1) {
    // One prefix, or Megatron's list of prefixes without weights.
    for (std::size_t i = 0; i < count; ++i) entries.push_back({checked_prefix(values, i, issues), {}});
  } else if (count % 2 == 1) {
    issues.push_back({kField, joined(values),
                      std::to_string(count) + " values holding " + std::to_string(numbers) +
                          " number(s): a weighted blend alternates weight and prefix, so its "
                          "count is even",
                      kFormsFix});
  } else {
    std::vector<double> weights;
    for (std::size_t i = 0; i < count; i += 2) {
      const auto weight = as_number(values[i]);
      if (!weight) {
        issues.push_back({kField, values[i],
                          position_of(i, count) +
                              " stands where a weight belongs but is not a number (values "
                              "alternate weight, prefix: W1 P1 W2 P2 ...)",
                          kFormsFix});
      } else if (!std::isfinite(*weight) || !(*weight > 0.0)) {
        issues.push_back({kField, values[i],
                          position_of(i, count) + " is a weight and must be a finite number > 0",
                          "give each dataset a positive weight; drop a dataset to give it none"});
      }
      weights.push_back(weight.value_or(0.0));
      entries.push_back({checked_prefix(values, i + 1, issues), {}});
    }
    if (issues.empty()) {
      const std::vector<double> normalized = normalize_weights(weights);
      for (std::size_t d = 0; d < entries.size(); ++d) entries[d].weight = normalized[d];
    }
  }
  if (!issues.empty()) throw ConfigError(issues);
  return entries;
}

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  if (weights.empty()) throw std::invalid_argument("normalize_weights: no weights");
  double sum = 0.0;
  for (const double weight : weights) {
    if (!std::isfinite(weight) || !(weight > 0.0)) {
      throw std::invalid_argument("normalize_weights: a weight is not a finite number > 0");
    }
    sum += weight;  // left to right, as numpy.sum does below 8 terms
  }
  if (!std::isfinite(sum)) throw std::invalid_argument("normalize_weights: the sum overflows");
  std::vector<double> normalized;
  normalized.reserve(weights.size());
  for (const double weight : weights) normalized.push_back(weight / sum);
  return normalized;
}

BlendingIndex::BlendingIndex(std::vector<double> weights) : weights_(std::move(weights)) {
  if (weights_.empty()) throw std::invalid_argument("BlendingIndex: no datasets");
  for (const double weight : weights_) {
    if (!std::isfinite(weight) || !(weight > 0.0)) {
      throw std::invalid_argument("BlendingIndex: a weight is not a finite number > 0");
    }
  }
  saved_counts_.assign(weights_.size(), 0);  // before sample 0: nothing taken
}

std::int64_t BlendingIndex::choose(std::int64_t blend_sample, std::vector<std::int64_t>& counts) const {
  // Megatron measures samples 0 and 1 against the same target, max(i, 1).
  const double target_samples = std::max(static_cast<double>(blend_sample), 1.0);
  std::size_t chosen = 0;
  double largest_error = weights_[0] * target_samples - static_cast<double>(counts[0]);
  for (std::size_t d = 1; d < weights_.size(); ++d) {
    const double error = weights_[d] * target_samples - static_cast<double>(counts[d]);
    if (error > largest_error) {  // strictly: ties stay with the lower dataset
      largest_error = error;
      chosen = d;
    }
  }
  ++counts[chosen];
  return static_cast<std::int64_t>(chosen);
}

BlendPosition BlendingIndex::at(std::int64_t blend_sample) const {
  if (blend_sample < 0) {
    throw std::out_of_range("BlendingIndex: sample " + std::to_string(blend_sample) +
                            " is negative");
  }
  const std::size_t datasets = weights_.size();
  if (datasets == 1) return {0, blend_sample};  // the greedy rule always picks the only dataset
  const std::int64_t stride = blend_sample / kCountStride;
  std::vector<std::int64_t> counts(datasets);
  {
    std::lock_guard lock(mutex_);
    const auto saved = static_cast<std::int64_t>(saved_counts_.size() / datasets);
    if (saved <= stride) {
      counts.assign(saved_counts_.end() - static_cast<std::ptrdiff_t>(datasets), saved_counts_.end());
      for (std::int64_t s = saved - 1; s < stride; ++s) {
        for (std::int64_t i = s * kCountStride; i < (s + 1) * kCountStride; ++i) choose(i, counts);
        saved_counts_.insert(saved_counts_.end(), counts.begin(), counts.end());
      }
    }
    const auto begin =
        saved_counts_.begin() + static_cast<std::ptrdiff_t>(stride * static_cast<std::int64_t>(datasets));
    std::copy(begin, begin + static_cast<std::ptrdiff_t>(datasets), counts.begin());
  }
  for (std::int64_t i = stride * kCountStride; i < blend_sample; ++i) choose(i, counts);
  const std::int64_t dataset = choose(blend_sample, counts);
  return {dataset, counts[static_cast<std::size_t>(dataset)] - 1};  // c_d before the choice
}

}  // namespace tandem::data
