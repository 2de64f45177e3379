// libFuzzer target: the indexed dataset reader (core/data/indexed_dataset.hpp, SPEC 2) on an
// arbitrary PREFIX.idx / PREFIX.bin pair. The input is a 4-byte little-endian length L, then L
// bytes of .idx, then the .bin (tests/fuzz/make_seed_corpus.sh packs real pairs that way). A
// refused pair is a DatasetError (the reader's clean error); a crash, a sanitizer report, a hang, a
// leak or any other exception is a finding. An accepted pair must then read every token of every
// sequence and every document boundary without error: open() promises it checked them all.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "core/data/indexed_dataset.hpp"
#include "tests/fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::silence_standard_streams();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem;
  constexpr std::size_t kLengthBytes = 4;
  if (size < kLengthBytes) return 0;
  std::size_t idx_bytes = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) idx_bytes |= std::size_t{data[i]} << (8 * i);
  const std::span<const std::uint8_t> rest(data + kLengthBytes, size - kLengthBytes);
  if (idx_bytes > rest.size()) idx_bytes = rest.size();
  const std::string prefix = (fuzz::scratch_directory() / "dataset").string();
  fuzz::write_file(data::idx_path(prefix), rest.first(idx_bytes));
  fuzz::write_file(data::bin_path(prefix), rest.subspan(idx_bytes));

  std::optional<data::IndexedDataset> dataset;
  try {
    dataset.emplace(data::IndexedDataset::open(prefix));
  } catch (const data::DatasetError&) {
    return 0;
  }
  // Accepted: everything it describes must be readable (float dtypes are refused by open()).
  std::int64_t tokens = 0;
  for (std::int64_t sequence = 0; sequence < dataset->sequence_count(); ++sequence) {
    tokens += static_cast<std::int64_t>(dataset->sequence_tokens(sequence).size());
  }
  for (std::int64_t document = 0; document <= dataset->document_count(); ++document) {
    const std::int64_t first_sequence = dataset->document_index(document);
    if (first_sequence < 0 || first_sequence > dataset->sequence_count()) {
      std::fprintf(stderr, "tandem fuzz: document %lld starts at sequence %lld of %lld\n",
                   static_cast<long long>(document), static_cast<long long>(first_sequence),
                   static_cast<long long>(dataset->sequence_count()));
      std::abort();
    }
  }
  if (tokens != dataset->total_tokens()) {
    std::fprintf(stderr, "tandem fuzz: the sequences hold %lld tokens, total_tokens() says %lld\n",
                 static_cast<long long>(tokens), static_cast<long long>(dataset->total_tokens()));
    std::abort();
  }
  return 0;
}
