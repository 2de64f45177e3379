// numpy's legacy RandomState as tandem reproduces it for --data-order megatron
// (core/data/numpy_random.hpp), against numpy itself: the expected values are computed by
// Debian's numpy (/usr/bin/python3) when the test runs. Exact comparison. Without numpy the
// test fails (ci/lib.sh installs python3-numpy).
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/data/numpy_random.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem::data {
namespace {

using testing::run_shell;
using testing::shell_quoted;

// Runs a Python program under Debian's interpreter and returns its whitespace-separated integers.
std::vector<std::uint64_t> numpy_says(const std::string& program) {
  const auto result = run_shell("/usr/bin/python3 -c " + shell_quoted(program) + " 2>&1");
  EXPECT_EQ(result.exit_code, 0) << "numpy (Debian's python3-numpy) is needed:\n" << result.output;
  std::vector<std::uint64_t> values;
  std::istringstream in(result.output);
  for (std::uint64_t value = 0; in >> value;) values.push_back(value);
  return values;
}

struct ShuffleCase {
  std::uint64_t seed;
  std::vector<std::int64_t> sizes;  // shuffled one after another from one RandomState
};

std::vector<std::uint64_t> tandem_shuffles(const ShuffleCase& c) {
  NumpyRandomState random(c.seed);
  std::vector<std::uint64_t> out;
  for (const std::int64_t size : c.sizes) {
    std::vector<std::uint32_t> items(static_cast<std::size_t>(size));
    for (std::size_t i = 0; i < items.size(); ++i) items[i] = static_cast<std::uint32_t>(i);
    random.shuffle(std::span<std::uint32_t>(items));
    out.insert(out.end(), items.begin(), items.end());
  }
  return out;
}

std::string numpy_shuffles_program(const ShuffleCase& c) {
  std::string sizes;
  for (const std::int64_t size : c.sizes) sizes += std::to_string(size) + ",";
  return "import numpy as np\n"
         "r = np.random.RandomState(" + std::to_string(c.seed) + ")\n"
         "for n in [" + sizes + "]:\n"
         "    a = np.arange(n, dtype=np.uint32)\n"
         "    r.shuffle(a)\n"
         "    print(' '.join(map(str, a.tolist())))\n";
}

TEST(NumpyRandomState, ShufflesEqualNumpysLegacyShuffles) {
  // Seeds at both ends of numpy's range and Megatron's default; sizes from the trivial to beyond
  // one MT19937 block (624 words), several shuffles drawn from one state as Megatron draws them.
  const std::vector<ShuffleCase> cases = {
      {0, {1, 2, 3, 10}},
      {1234, {40, 17, 1000}},
      {42, {5000}},
      {4294967295u, {70000, 3}},
  };
  for (const auto& c : cases) {
    const auto expected = numpy_says(numpy_shuffles_program(c));
    const auto actual = tandem_shuffles(c);
    ASSERT_EQ(actual.size(), expected.size()) << "seed " << c.seed;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      ASSERT_EQ(actual[i], expected[i]) << "seed " << c.seed << ", element " << i;
    }
  }
}

TEST(NumpyRandomState, AnotherSeedIsRejected) {
  // Negative control: the comparison above tells generators apart.
  const ShuffleCase numpy_case{1234, {40}};
  const auto expected = numpy_says(numpy_shuffles_program(numpy_case));
  EXPECT_NE(tandem_shuffles(ShuffleCase{1235, {40}}), expected);
}

TEST(NumpyRandomState, SixtyFourBitWordsPutTheFirstOutputHigh) {
  // numpy's legacy randint over [0, 2^40) masks one next_uint64 with 2^40 - 1 and never rejects:
  // the same words random_interval(2^40 - 1) draws (shuffles of more than 2^32 items).
  const auto expected = numpy_says(
      "import numpy as np\n"
      "print(' '.join(map(str, np.random.RandomState(7).randint(0, 2**40, size=6, dtype=np.uint64).tolist())))\n");
  NumpyRandomState random(7);
  std::vector<std::uint64_t> actual;
  for (int i = 0; i < 6; ++i) actual.push_back(random.random_interval((std::uint64_t{1} << 40) - 1));
  EXPECT_EQ(actual, expected);
}

TEST(NumpyRandomState, SeedsOutsideNumpysRangeAreRefused) {
  EXPECT_THROW(NumpyRandomState(std::uint64_t{1} << 32), std::invalid_argument);
  EXPECT_NO_THROW(NumpyRandomState((std::uint64_t{1} << 32) - 1));
}

}  // namespace
}  // namespace tandem::data
