// The number formatting the planner's text shares: its warnings and advice (planner.cpp) and its
// printed plan (planner_output.cpp). Internal to the planner.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::planner_format {

// 1234567 -> "1,234,567".
std::string grouped(std::int64_t value);
// `value` with `decimals` digits after the point: fixed(1.5, 2) -> "1.50".
std::string fixed(double value, int decimals);

}  // namespace tandem::planner_format
