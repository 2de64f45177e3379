// Packing, sample order, masks and positions (SPEC 2, 3): hand-made windows whose exact Sample is
// written out, concat and unit packing over small datasets, the document-order generator pinned
// to golden values, the DP sample order, and RapidCheck properties over random datasets.
// Every comparison is exact.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/data/document_order.hpp"
#include "core/data/indexed_dataset.hpp"
#include "core/data/packing.hpp"
#include "core/data/training_data.hpp"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<std::int32_t>;
constexpr std::int32_t E = kEodToken;  // shorthand in hand-written windows
constexpr std::int32_t P = kPadToken;

// A dataset written to a fresh temporary directory, removed with the object.
class TempDataset {
 public:
  explicit TempDataset(const std::vector<Tokens>& documents) {
    std::string pattern = (fs::temp_directory_path() / "tandem_packing_XXXXXX").string();
    directory_ = ::mkdtemp(pattern.data());
    IndexedDatasetWriterConfig config;
    config.prefix = directory_ + "/ds";
    IndexedDatasetWriter writer(config);
    for (const auto& document : documents) writer.add_document(document);
    writer.finish();
    dataset_ = std::make_shared<const IndexedDataset>(IndexedDataset::open(config.prefix));
  }
  ~TempDataset() { fs::remove_all(directory_); }
  std::shared_ptr<const IndexedDataset> get() const { return dataset_; }

 private:
  std::string directory_;
  std::shared_ptr<const IndexedDataset> dataset_;
};

SampleSourceConfig source_config(std::int64_t seq_length, Packing packing, DataOrder order) {
  SampleSourceConfig config;
  config.seq_length = seq_length;
  config.data.packing = packing;
  config.data.data_order = order;
  return config;
}

// The documents as the writer stores them: EOD appended to each non-empty one.
Tokens stream_of(const std::vector<Tokens>& documents, const std::vector<std::int64_t>& order) {
  Tokens stream;
  for (std::int64_t index : order) {
    const auto& document = documents[static_cast<std::size_t>(index)];
    if (document.empty()) continue;
    stream.insert(stream.end(), document.begin(), document.end());
    stream.push_back(E);
  }
  return stream;
}

// ---- build_sample: hand-made windows ----------------------------------------------------------

TEST(BuildSample, EodAtTheFirstPosition) {
  // L = 4: inputs [E a b c], labels [a b c E].
  const Sample s = build_sample(7, Tokens{E, 1, 2, 3, E}, MaskRules{});
  EXPECT_EQ(s.global_index, 7);
  EXPECT_EQ(s.tokens, (Tokens{E, 1, 2, 3}));
  EXPECT_EQ(s.labels, (Tokens{1, 2, 3, E}));
  EXPECT_EQ(s.positions, (Tokens{0, 0, 1, 2}));        // restart after the EOD
  EXPECT_EQ(s.attention_start, (Tokens{0, 1, 1, 1}));  // the EOD belongs to the earlier document
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{0, 1, 1, 1}));  // input EOD: no loss
  EXPECT_EQ(s.input_tokens, 4);
  EXPECT_EQ(s.loss_tokens, 3);
  EXPECT_EQ(s.pad_tokens, 0);
}

TEST(BuildSample, EodAtTheLastInputPosition) {
  const Sample s = build_sample(0, Tokens{1, 2, 3, E, 9}, MaskRules{});
  EXPECT_EQ(s.positions, (Tokens{0, 1, 2, 3}));  // the EOD keeps its document's position
  EXPECT_EQ(s.attention_start, (Tokens{0, 0, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(s.loss_tokens, 3);
}

TEST(BuildSample, EodOnlyAsTheLastLabelIsLearned) {
  const Sample s = build_sample(0, Tokens{1, 2, 3, 4, E}, MaskRules{});
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 1}));  // SPEC 3: EOD is a target
  EXPECT_EQ(s.positions, (Tokens{0, 1, 2, 3}));
}

TEST(BuildSample, PadInUnitPacking) {
  // L = 5: [a E b E P P]: inputs [a E b E P], labels [E b E P P].
  const Sample s = build_sample(0, Tokens{1, E, 2, E, P, P}, MaskRules{});
  EXPECT_EQ(s.positions, (Tokens{0, 1, 0, 1, 0}));
  EXPECT_EQ(s.attention_start, (Tokens{0, 0, 2, 2, 4}));  // PAD attends only to itself
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 0, 1, 0, 0}));
  EXPECT_EQ(s.input_tokens, 4);
  EXPECT_EQ(s.pad_tokens, 1);
  EXPECT_EQ(s.loss_tokens, 2);
}

TEST(BuildSample, LabelPadHasNoLoss) {
  // A document ending exactly at the last input slot, the label slot padded: [a b c d P].
  const Sample s = build_sample(0, Tokens{1, 2, 3, 4, P}, MaskRules{});
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(s.pad_tokens, 0);
}

TEST(BuildSample, WindowWithNoLossTokens) {
  const Sample s = build_sample(0, Tokens{E, P, P, P, P}, MaskRules{});
  EXPECT_EQ(s.loss_tokens, 0);
  EXPECT_EQ(s.input_tokens, 1);
  EXPECT_EQ(s.pad_tokens, 3);
  EXPECT_EQ(s.input_tokens + s.pad_tokens, 4);
}

TEST(BuildSample, FlagsOffMeanPlainCausalTraining) {
  MaskRules rules;
  rules.reset_position_ids = false;
  rules.reset_attention_mask = false;
  rules.eod_mask_loss = false;
  const Sample s = build_sample(0, Tokens{1, E, 2, E, 3}, rules);
  EXPECT_EQ(s.positions, (Tokens{0, 1, 2, 3}));
  EXPECT_EQ(s.attention_start, (Tokens{0, 0, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 1}));
  // Each flag alone: only its own field changes.
  MaskRules only_positions;
  only_positions.reset_attention_mask = false;
  only_positions.eod_mask_loss = false;
  const Sample p = build_sample(0, Tokens{1, E, 2, E, 3}, only_positions);
  EXPECT_EQ(p.positions, (Tokens{0, 1, 0, 1}));
  EXPECT_EQ(p.attention_start, (Tokens{0, 0, 0, 0}));
  EXPECT_EQ(p.loss_tokens, 4);
}

// ---- Concat packing ---------------------------------------------------------------------------

TEST(ConcatPacking, WindowsShareOneTokenAndFollowTheStream) {
  const std::vector<Tokens> documents = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10}};
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(4, Packing::concat, DataOrder::sequential));
  const Tokens stream = stream_of(documents, {0, 1, 2});  // 13 tokens per epoch
  EXPECT_EQ(source.tokens_per_epoch(), 13);
  for (std::int64_t i = 0; i < 2; ++i) {
    const Tokens expected(stream.begin() + i * 4, stream.begin() + i * 4 + 5);  // [i*L, i*L+L+1)
    EXPECT_EQ(source.window_tokens(i), expected) << "sample " << i;
    EXPECT_EQ(source.sample(i).labels.back(), source.sample(i + 1).tokens.front());
  }
  // Sample 1 = stream [4, 9) = [4 5 E 6 7]: positions restart after the EOD, attention too.
  const Sample s = source.sample(1);
  EXPECT_EQ(s.tokens, (Tokens{4, 5, E, 6}));
  EXPECT_EQ(s.positions, (Tokens{0, 1, 2, 0}));
  EXPECT_EQ(s.attention_start, (Tokens{0, 0, 0, 3}));
  EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 0, 1}));
}

TEST(ConcatPacking, StraddlesEpochsWithoutABreak) {
  const std::vector<Tokens> documents = {{1, 2}, {3, 4, 5}};  // 7 tokens per epoch
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(3, Packing::concat, DataOrder::sequential));
  // Sample 2 covers stream tokens [6, 10): the last EOD of epoch 0, then epoch 1's start.
  EXPECT_EQ(source.window_tokens(2), (Tokens{E, 1, 2, E}));
  EXPECT_EQ(source.epoch_of_sample(2), 0);  // its first token lies in epoch 0
  EXPECT_EQ(source.epoch_of_sample(3), 1);
  // Epoch e starts at sample ceil(e*7/3): 0, 3, 5, 7.
  EXPECT_EQ(source.first_sample_of_epoch(1), 3);
  EXPECT_EQ(source.first_sample_of_epoch(2), 5);
  EXPECT_EQ(source.samples_in_epoch(2), 7 - 5);
}

TEST(ConcatPacking, LongDocumentPositionsRestartAtEachWindow) {
  TempDataset dataset({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}});
  const SampleSource source(dataset.get(), source_config(4, Packing::concat, DataOrder::sequential));
  const Sample second = source.sample(1);  // tokens 5..8 of the same document
  EXPECT_EQ(second.tokens, (Tokens{5, 6, 7, 8}));
  EXPECT_EQ(second.positions, (Tokens{0, 1, 2, 3}));  // SPEC 3: count from the window's start
  EXPECT_EQ(second.attention_start, (Tokens{0, 0, 0, 0}));
  EXPECT_EQ(second.loss_tokens, 4);
}

TEST(ConcatPacking, EmptyDocumentsAddNothing) {
  const std::vector<Tokens> documents = {{}, {1}, {}, {}, {2, 3}, {}};
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(2, Packing::concat, DataOrder::sequential));
  EXPECT_EQ(source.window_tokens(0), (Tokens{1, E, 2}));
  EXPECT_EQ(source.window_tokens(1), (Tokens{2, 3, E}));
  EXPECT_EQ(source.window_tokens(2), (Tokens{E, 1, E}));  // epoch 1 follows at once
}

TEST(ConcatPacking, SplitReadsOnlyItsSequences) {
  const std::vector<Tokens> documents = {{1}, {2}, {3}, {4}};
  TempDataset dataset(documents);
  auto config = source_config(1, Packing::concat, DataOrder::sequential);
  config.data.split = "1,1";  // train = sequences [0, 2), valid = [2, 4)
  const SampleSource train(dataset.get(), config);
  EXPECT_EQ(train.sequence_range(), (SequenceRange{0, 2}));
  EXPECT_EQ(train.window_tokens(3), (Tokens{E, 1}));  // stream 1 E 2 E | 1 E ...
  config.split = DatasetSplit::valid;
  const SampleSource valid(dataset.get(), config);
  EXPECT_EQ(valid.window_tokens(0), (Tokens{3, E}));
  config.split = DatasetSplit::test;
  EXPECT_THROW(SampleSource(dataset.get(), config), DatasetError);  // an empty split
}

TEST(ConcatPacking, TokensOutsideTheVocabularyAreRefusedWhenTheSourceIsBuilt) {
  TempDataset dataset({{1, 2}, {3, P}});  // sequences [1 2 E] and [3 257 E]
  auto config = source_config(2, Packing::concat, DataOrder::sequential);
  config.vocab_size = P;  // 257 ids: 257 lies outside
  try {
    const SampleSource source(dataset.get(), config);
    ADD_FAILURE() << "token 257 accepted with a vocabulary of 257";
  } catch (const DatasetError& error) {
    // docs/DATA.md section 13: named by its sequence, before any sample is read.
    EXPECT_NE(std::string(error.what()).find("sequence 1 holds token 257"), std::string::npos) << error.what();
  }
  config.precheck_tokens = 4;  // 1 2 E 3: short of 257, the fifth token
  EXPECT_NO_THROW(SampleSource(dataset.get(), config));
  config.precheck_tokens = 5;
  EXPECT_THROW(SampleSource(dataset.get(), config), DatasetError);
}

TEST(ConcatPacking, TokensOutsideTheVocabularyAreRefusedInEveryWindow) {
  TempDataset dataset({{1, 200}});
  auto config = source_config(2, Packing::concat, DataOrder::sequential);
  config.vocab_size = 100;
  config.precheck_tokens = 0;  // past the tokens checked when the source is built
  const SampleSource source(dataset.get(), config);
  try {
    source.sample(0);
    ADD_FAILURE() << "token 200 accepted with a vocabulary of 100";
  } catch (const DatasetError& error) {
    EXPECT_NE(std::string(error.what()).find("token 200"), std::string::npos) << error.what();
  }
}

// ---- Document order ---------------------------------------------------------------------------

TEST(DocumentOrder, SplitMix64MatchesItsPublishedFirstOutput) {
  SplitMix64 stream(0);
  EXPECT_EQ(stream.next(), 0xE220A8397B1DCDAFULL);  // SplitMix64 seeded 0 (Vigna's reference)
}

TEST(DocumentOrder, PermutationsArePinnedToTheDocumentedStream) {
  // Golden values from the stream of docs/DATA.md, computed independently in Python there.
  EXPECT_EQ(epoch_order(10, true, 1234, 0), (std::vector<std::int64_t>{6, 8, 4, 3, 2, 7, 5, 0, 1, 9}));
  EXPECT_EQ(epoch_order(10, true, 1234, 1), (std::vector<std::int64_t>{5, 8, 9, 6, 3, 0, 7, 2, 4, 1}));
  EXPECT_EQ(epoch_order(10, true, 42, 0), (std::vector<std::int64_t>{4, 0, 6, 5, 2, 8, 7, 1, 9, 3}));
  EXPECT_EQ(epoch_order(4, false, 1234, 3), (std::vector<std::int64_t>{0, 1, 2, 3}));
}

TEST(DocumentOrder, BoundedIntegersStayInRangeAndReachEveryValue) {
  // Unbiasedness is by construction (words below 2^64 mod bound are redrawn); here: the range.
  SplitMix64 stream(7);
  std::map<std::uint64_t, int> counts;
  for (int i = 0; i < 3000; ++i) ++counts[stream.below(3)];
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [value, count] : counts) EXPECT_LT(value, 3u);
}

TEST(ShuffledOrder, ReproducibleFromTheSeedAndDifferentPerEpoch) {
  std::vector<Tokens> documents;
  for (std::int32_t d = 0; d < 20; ++d) documents.push_back(Tokens(static_cast<std::size_t>(d % 5 + 1), d));
  TempDataset dataset(documents);
  auto config = source_config(8, Packing::concat, DataOrder::shuffled);
  const SampleSource first(dataset.get(), config);
  const SampleSource again(dataset.get(), config);
  EXPECT_EQ(first.sequence_order(0), again.sequence_order(0));
  EXPECT_NE(first.sequence_order(0), first.sequence_order(1));
  auto sorted = first.sequence_order(1);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, epoch_order(20, false, 0, 0));  // a permutation of every sequence
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(first.window_tokens(i), again.window_tokens(i));
  // The samples follow the shuffled stream across the epoch boundary.
  Tokens stream = stream_of(documents, first.sequence_order(0));
  const Tokens epoch1 = stream_of(documents, first.sequence_order(1));
  stream.insert(stream.end(), epoch1.begin(), epoch1.end());
  for (std::int64_t i = 0; (i + 1) * 8 + 1 <= static_cast<std::int64_t>(stream.size()); ++i) {
    EXPECT_EQ(first.window_tokens(i), Tokens(stream.begin() + i * 8, stream.begin() + i * 8 + 9));
  }
  config.data.seed = 1235;
  const SampleSource other(dataset.get(), config);
  EXPECT_NE(other.sequence_order(0), first.sequence_order(0));
}

TEST(SampleSourceThreads, ConcurrentReadersSeeTheSameSamples) {
  std::vector<Tokens> documents;
  for (std::int32_t d = 0; d < 40; ++d) documents.push_back(Tokens(static_cast<std::size_t>(d % 9 + 1), d));
  TempDataset dataset(documents);
  for (const Packing packing : {Packing::concat, Packing::units}) {
    const SampleSource shared(dataset.get(), source_config(5, packing, DataOrder::shuffled));
    const SampleSource alone(dataset.get(), source_config(5, packing, DataOrder::shuffled));
    constexpr int kThreads = 4;
    constexpr std::int64_t kSamplesPerThread = 200;  // several epochs, so layouts are evicted
    std::vector<std::vector<Tokens>> seen(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (std::int64_t i = 0; i < kSamplesPerThread; ++i) {
          seen[static_cast<std::size_t>(t)].push_back(shared.window_tokens((i * 7 + t) % kSamplesPerThread));
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
      for (std::int64_t i = 0; i < kSamplesPerThread; ++i) {
        ASSERT_EQ(seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)],
                  alone.window_tokens((i * 7 + t) % kSamplesPerThread));
      }
    }
  }
}

// ---- Unit packing -----------------------------------------------------------------------------

TEST(UnitPacking, ShortDocumentsAreNeverSplitAndTheRestIsPad) {
  // L = 4: a window holds 5 token slots. Documents with EOD: [1 2 E] [3 4 E] [5 E] [6 7 8 9 E].
  const std::vector<Tokens> documents = {{1, 2}, {3, 4}, {5}, {6, 7, 8, 9}};
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(4, Packing::units, DataOrder::sequential));
  EXPECT_EQ(source.samples_in_epoch(0), 3);
  EXPECT_EQ(source.window_tokens(0), (Tokens{1, 2, E, P, P}));  // [3 4 E] does not fit
  EXPECT_EQ(source.window_tokens(1), (Tokens{3, 4, E, 5, E}));
  EXPECT_EQ(source.window_tokens(2), (Tokens{6, 7, 8, 9, E}));  // exactly L+1 tokens
  EXPECT_EQ(source.window_tokens(3), (Tokens{1, 2, E, P, P}));  // epoch 1
  const Sample padded = source.sample(0);
  EXPECT_EQ(padded.input_tokens, 3);
  EXPECT_EQ(padded.pad_tokens, 1);
  EXPECT_EQ(padded.loss_tokens, 2);  // 1->2, 2->E; E->PAD and PAD->PAD are masked
  EXPECT_EQ(padded.attention_start, (Tokens{0, 0, 0, 3}));
}

TEST(UnitPacking, LongDocumentsSplitIntoPiecesOverlappingByOneToken) {
  // 10 tokens + EOD = 11 tokens, L = 4: pieces [0,5) [4,9) [8,11), then [20 E] joins the tail.
  const std::vector<Tokens> documents = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {20}};
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(4, Packing::units, DataOrder::sequential));
  EXPECT_EQ(source.window_tokens(0), (Tokens{1, 2, 3, 4, 5}));
  EXPECT_EQ(source.window_tokens(1), (Tokens{5, 6, 7, 8, 9}));
  EXPECT_EQ(source.window_tokens(2), (Tokens{9, 10, E, 20, E}));
  EXPECT_EQ(source.samples_in_epoch(0), 3);
  // A document of 1 + k*L tokens ends exactly on a piece: 8 tokens + EOD = 1 + 2*4 gives pieces
  // [0,5) [4,9); no one-token piece follows, its only token being a label already.
  TempDataset exact({{1, 2, 3, 4, 5, 6, 7, 8}});  // 9 tokens with EOD = 1 + 2*4
  const SampleSource exact_source(exact.get(), source_config(4, Packing::units, DataOrder::sequential));
  EXPECT_EQ(exact_source.samples_in_epoch(0), 2);
  EXPECT_EQ(exact_source.window_tokens(1), (Tokens{5, 6, 7, 8, E}));
}

TEST(UnitPacking, ShuffledEpochsPackTheirOwnOrder) {
  std::vector<Tokens> documents;
  for (std::int32_t d = 0; d < 30; ++d) documents.push_back(Tokens(static_cast<std::size_t>(d % 7 + 1), d));
  TempDataset dataset(documents);
  const SampleSource source(dataset.get(), source_config(6, Packing::units, DataOrder::shuffled));
  std::int64_t index = 0;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(source.first_sample_of_epoch(epoch), index);
    for (std::int64_t w = 0; w < source.samples_in_epoch(epoch); ++w, ++index) {
      EXPECT_EQ(source.epoch_of_sample(index), epoch);
    }
  }
}

// ---- From a run's configuration --------------------------------------------------------------

TEST(TrainingData, WithoutDataPathTheEmbeddedCorpusTrains) {
  std::string pattern = (fs::temp_directory_path() / "tandem_training_XXXXXX").string();
  const std::string directory = ::mkdtemp(pattern.data());
  RunConfig run;  // data_path empty: the embedded corpus; seq_length 32; shuffled, concat
  const auto samples = open_training_samples(run, directory);
  ASSERT_EQ(samples->datasets().size(), 1u);
  EXPECT_EQ(samples->datasets().front().samples->config().seq_length, run.model.seq_length);
  EXPECT_GT(samples->datasets().front().samples->samples_per_epoch(), 1000);
  const Sample s = samples->sample(5);
  EXPECT_EQ(static_cast<std::int64_t>(s.tokens.size()), run.model.seq_length);
  EXPECT_EQ(s.input_tokens, run.model.seq_length);
  EXPECT_GT(s.loss_tokens, 0);
  // --data-path names the same files: the same samples.
  run.data.data_path = {{directory + "/default_corpus", {}}};
  const auto named = open_training_samples(run);
  EXPECT_EQ(named->window_tokens(5), samples->window_tokens(5));
  fs::remove_all(directory);
}

// ---- Sample order over ranks ------------------------------------------------------------------

TEST(SampleOrder, MicrobatchesAndRanksFollowMegatronsSampler) {
  MicrobatchPosition position;
  position.consumed_samples = 96;
  position.micro_batch_size = 2;
  position.data_parallel_size = 4;
  position.microbatch = 1;
  position.data_parallel_rank = 3;
  // 96 + 1*2*4 + 3*2 + [0, 2) = {110, 111}.
  EXPECT_EQ(microbatch_sample_indices(position), (std::vector<std::int64_t>{110, 111}));
  // One iteration of 3 microbatches covers [consumed, consumed + GBS) exactly once.
  std::vector<std::int64_t> all;
  for (position.microbatch = 0; position.microbatch < 3; ++position.microbatch) {
    for (position.data_parallel_rank = 0; position.data_parallel_rank < 4;
         ++position.data_parallel_rank) {
      const auto indices = microbatch_sample_indices(position);
      all.insert(all.end(), indices.begin(), indices.end());
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expected(2 * 3 * 4);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = 96 + static_cast<std::int64_t>(i);
  EXPECT_EQ(all, expected);
  position.data_parallel_rank = 4;
  EXPECT_THROW(microbatch_sample_indices(position), std::invalid_argument);
}

// ---- Properties -------------------------------------------------------------------------------

// Random documents of byte tokens (0-255, so never EOD or PAD); some empty.
rc::Gen<std::vector<Tokens>> documents_gen() {
  return rc::gen::nonEmpty(rc::gen::container<std::vector<Tokens>>(
      rc::gen::container<Tokens>(rc::gen::inRange<std::int32_t>(0, 256))));
}

struct Case {
  std::vector<Tokens> documents;
  std::int64_t seq_length = 1;
};

rc::Gen<Case> case_gen() {
  return rc::gen::apply(
      [](std::vector<Tokens> documents, std::int64_t seq_length) {
        // At least one non-empty document so the split has tokens.
        if (std::all_of(documents.begin(), documents.end(), [](const Tokens& d) { return d.empty(); })) {
          documents.front().push_back(0);
        }
        return Case{std::move(documents), seq_length};
      },
      documents_gen(), rc::gen::inRange<std::int64_t>(1, 17));
}

// Invariants every sample satisfies, whatever the packing (SPEC 3).
void check_sample_invariants(const Sample& s, std::int64_t seq_length) {
  const auto length = static_cast<std::size_t>(seq_length);
  RC_ASSERT(s.tokens.size() == length);
  RC_ASSERT(s.input_tokens + s.pad_tokens == seq_length);
  std::int64_t loss = 0;
  for (std::size_t t = 0; t < length; ++t) {
    loss += s.loss_mask[t];
    // Positions restart exactly after an EOD and count up otherwise.
    const bool after_eod = t > 0 && s.tokens[t - 1] == E;
    if (t == 0 || after_eod) {
      RC_ASSERT(s.positions[t] == 0);
    } else {
      RC_ASSERT(s.positions[t] == s.positions[t - 1] + 1);
    }
    // attention_start never crosses an EOD and starts a document (or the window).
    const auto start = static_cast<std::size_t>(s.attention_start[t]);
    RC_ASSERT(start <= t);
    for (std::size_t k = start; k < t; ++k) RC_ASSERT(s.tokens[k] != E);
    // (Booleans first: RC_ASSERT captures its expression, so || inside it would not short-circuit.)
    const bool starts_document = start == 0 || s.tokens[start - 1] == E || s.tokens[t] == P;
    RC_ASSERT(starts_document);
    if (s.tokens[t] == P) RC_ASSERT(start == t);
    // Loss only where neither side is PAD and the input is not EOD.
    if (s.loss_mask[t] == 1) {
      RC_ASSERT(s.tokens[t] != E);
      RC_ASSERT(s.tokens[t] != P);
      RC_ASSERT(s.labels[t] != P);
    }
  }
  RC_ASSERT(loss == s.loss_tokens);
}

RC_GTEST_PROP(ConcatProperties, EveryStreamTokenIsAnInputOfExactlyOneWindow, ()) {
  const Case c = *case_gen();
  TempDataset dataset(c.documents);
  const SampleSource source(dataset.get(),
                            source_config(c.seq_length, Packing::concat, DataOrder::sequential));
  std::vector<std::int64_t> order(c.documents.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  const Tokens epoch = stream_of(c.documents, order);
  const std::int64_t samples = *rc::gen::inRange<std::int64_t>(1, 12);
  Tokens inputs;
  for (std::int64_t i = 0; i < samples; ++i) {
    const Sample s = source.sample(i);
    check_sample_invariants(s, c.seq_length);
    RC_ASSERT(s.pad_tokens == 0);  // SPEC 2: concat never pads
    inputs.insert(inputs.end(), s.tokens.begin(), s.tokens.end());
    const Sample next = source.sample(i + 1);
    RC_ASSERT(s.labels.back() == next.tokens.front());  // consecutive windows share one token
  }
  // The inputs of consecutive samples are the stream (epochs repeated), each token once.
  for (std::size_t k = 0; k < inputs.size(); ++k) RC_ASSERT(inputs[k] == epoch[k % epoch.size()]);
}

RC_GTEST_PROP(ShuffledProperties, SameSeedSameSamplesAndEachEpochIsAPermutation, ()) {
  const Case c = *case_gen();
  TempDataset dataset(c.documents);
  auto config = source_config(c.seq_length, Packing::concat, DataOrder::shuffled);
  config.data.seed = *rc::gen::arbitrary<std::uint64_t>();
  const SampleSource first(dataset.get(), config);
  const SampleSource second(dataset.get(), config);
  const std::int64_t epoch = *rc::gen::inRange<std::int64_t>(0, 5);
  auto order = first.sequence_order(epoch);
  RC_ASSERT(order == second.sequence_order(epoch));
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < order.size(); ++i) RC_ASSERT(order[i] == static_cast<std::int64_t>(i));
  const std::int64_t index = *rc::gen::inRange<std::int64_t>(0, 40);
  RC_ASSERT(first.window_tokens(index) == second.window_tokens(index));
}

RC_GTEST_PROP(UnitProperties, EveryWithinDocumentTransitionIsTrainedOncePerEpoch, ()) {
  const Case c = *case_gen();
  TempDataset dataset(c.documents);
  const SampleSource source(dataset.get(),
                            source_config(c.seq_length, Packing::units, DataOrder::sequential));
  // Expected: each (token, next token) pair inside a document, the EOD as the last target.
  std::map<std::pair<std::int32_t, std::int32_t>, std::int64_t> expected;
  for (const auto& document : c.documents) {
    if (document.empty()) continue;
    Tokens with_eod = document;
    with_eod.push_back(E);
    for (std::size_t j = 0; j + 1 < with_eod.size(); ++j) ++expected[{with_eod[j], with_eod[j + 1]}];
  }
  std::map<std::pair<std::int32_t, std::int32_t>, std::int64_t> trained;
  for (std::int64_t i = 0; i < source.samples_in_epoch(0); ++i) {
    const Sample s = source.sample(i);
    check_sample_invariants(s, c.seq_length);
    for (std::size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.loss_mask[t] == 1) ++trained[{s.tokens[t], s.labels[t]}];
    }
    // PAD only at the end of a window.
    const auto first_pad = std::find(s.tokens.begin(), s.tokens.end(), P);
    RC_ASSERT(std::all_of(first_pad, s.tokens.end(), [](std::int32_t token) { return token == P; }));
  }
  RC_ASSERT(trained == expected);
}

RC_GTEST_PROP(SampleOrderProperties, AnIterationCoversItsGlobalBatchOnce, ()) {
  MicrobatchPosition position;
  position.consumed_samples = *rc::gen::inRange<std::int64_t>(0, 1000000);
  position.micro_batch_size = *rc::gen::inRange<std::int64_t>(1, 9);
  position.data_parallel_size = *rc::gen::inRange<std::int64_t>(1, 9);
  const std::int64_t microbatches = *rc::gen::inRange<std::int64_t>(1, 9);
  std::vector<std::int64_t> all;
  for (position.microbatch = 0; position.microbatch < microbatches; ++position.microbatch) {
    for (position.data_parallel_rank = 0; position.data_parallel_rank < position.data_parallel_size;
         ++position.data_parallel_rank) {
      const auto indices = microbatch_sample_indices(position);
      all.insert(all.end(), indices.begin(), indices.end());
    }
  }
  std::sort(all.begin(), all.end());
  const std::int64_t global_batch = position.micro_batch_size * position.data_parallel_size * microbatches;
  RC_ASSERT(static_cast<std::int64_t>(all.size()) == global_batch);
  for (std::int64_t i = 0; i < global_batch; ++i) {
    RC_ASSERT(all[static_cast<std::size_t>(i)] == position.consumed_samples + i);
  }
}

}  // namespace
}  // namespace tandem::data
