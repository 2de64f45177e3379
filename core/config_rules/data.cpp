// The data's rules: the data order, packing and loss normalization (SPEC 2, 3, 5), --data-path and
// --split (docs/DATA.md sections 4, 9), and the tokenizer the data was built with (SPEC 13).
#include "core/config_rules/rules.hpp"

#include <cstdint>
#include <string>

#include "core/data/blend.hpp"
#include "core/data/split.hpp"
#include "core/data/tokenizer.hpp"

namespace tandem::config_rules {

// Loss normalization, data order and packing onto their enums; the data path; Megatron's order's
// own rules.
void resolve_data_choices(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& data = config.data;
  checker.choose("--loss-normalization", args.loss_normalization,
                 {{"per-token", LossNormalization::per_token}, {"microbatch-mean", LossNormalization::microbatch_mean}},
                 data.loss_normalization, "must be per-token or microbatch-mean (SPEC 5)", "use one of those two");
  checker.check(!(args.calculate_per_token_loss &&
                  data.loss_normalization != LossNormalization::per_token),
                "--calculate-per-token-loss", "true",
                "contradicts --loss-normalization " + args.loss_normalization,
                "give only one of the two");
  checker.choose("--data-order", args.data_order,
                 {{"sequential", DataOrder::sequential}, {"shuffled", DataOrder::shuffled},
                  {"megatron", DataOrder::megatron}},
                 data.data_order, "must be sequential, shuffled or megatron (SPEC 12, 13)", "use one of those three");
  checker.choose("--packing", args.packing, {{"concat", Packing::concat}, {"units", Packing::units}}, data.packing,
                 "must be concat or units (SPEC 2)", "use one of those two");
  try {
    data.data_path = data::parse_data_path(args.data_paths);
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
  }
  if (data.data_order == DataOrder::megatron) {
    // Megatron's GPTDataset packs by concatenation and seeds numpy's RandomState with --seed.
    checker.check(data.packing == Packing::concat, "--packing", args.packing,
                  "--data-order megatron is Megatron's GPTDataset, which concatenates documents",
                  "use --packing concat (the default) or another --data-order");
    checker.check(data.seed < (std::uint64_t{1} << 32), "--seed", std::to_string(data.seed),
                  "--data-order megatron seeds numpy.random.RandomState, which takes [0, 2^32)",
                  "give a smaller --seed");
  }
  if (!data.data_cache_path.empty() && data.data_order != DataOrder::megatron) {
    config.argument_warnings.push_back("--data-cache-path " + data.data_cache_path + " with --data-order " +
                                       args.data_order + ": unused (only --data-order megatron builds index files)");
  }
}

// --split's weights (throws ConfigError).
void check_split(const RunConfig& config) {
  if (!config.data.split.empty()) data::parse_split_weights(config.data.split);
}

// SPEC 13: the special ids and the vocabulary size come from the tokenizer the data was built
// with (docs/DATA.md section 13); the byte tokenizer's only when none is named.
void resolve_tokenizer(const RunArguments& args, RunConfig& config, Checker& checker) {
  auto& tokenizer = config.tokenizer;
  const std::string kinds =
      "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer or bytes";
  if (args.given("--tokenizer-type")) {
    const auto type = data::parse_tokenizer_type(args.tokenizer_type);
    if (!type) {
      checker.fail("--tokenizer-type", args.tokenizer_type,
                   "is not a tokenizer type tandem reads (" + kinds + "; Megatron's spelling)",
                   "name the tokenizer the data was built with, e.g. --tokenizer-type GPT2BPETokenizer");
      return;
    }
    tokenizer.type = *type;
  }
  // Megatron ignores a file option its tokenizer type does not read; tandem says so.
  const auto read_only_by = [&](const char* option, const std::string& value, bool read, const char* readers) {
    checker.check(!args.given(option) || read, option, value,
                  "is read only by --tokenizer-type " + std::string(readers) + ", not " + to_string(tokenizer.type),
                  "drop it, or name the tokenizer that reads it");
  };
  const bool gpt2 = tokenizer.type == TokenizerType::gpt2_bpe;
  read_only_by("--vocab-file", tokenizer.vocab_file, gpt2, "GPT2BPETokenizer");
  read_only_by("--merge-file", tokenizer.merge_file, gpt2, "GPT2BPETokenizer");
  const bool null = tokenizer.type == TokenizerType::null_tokenizer;
  read_only_by("--null-tokenizer-eod-id", std::to_string(args.null_tokenizer_eod_id), null, "NullTokenizer");
  read_only_by("--null-tokenizer-pad-id", std::to_string(args.null_tokenizer_pad_id), null, "NullTokenizer");
  read_only_by("--tokenizer-model", tokenizer.tokenizer_model,
               tokenizer.type == TokenizerType::huggingface || tokenizer.type == TokenizerType::sentencepiece ||
                   tokenizer.type == TokenizerType::llama2,
               "HuggingFaceTokenizer, SentencePieceTokenizer or Llama2Tokenizer");
  // The byte tokenizer with another --vocab-size plans (the seed's fragment gives 128,256 ids);
  // a run that reads data with it is refused (data::open_training_samples_at).
  if (tokenizer.type == TokenizerType::bytes) return;
  if (tokenizer.type == TokenizerType::null_tokenizer) {
    checker.check(args.given("--vocab-size"), "--vocab-size", "not given",
                  "--tokenizer-type NullTokenizer takes its size from --vocab-size (Megatron asserts it is given)",
                  "give --vocab-size N, the number of the data's ids (EOD = N - 1 unless --null-tokenizer-eod-id)");
    if (!args.given("--vocab-size")) return;
  }
  try {
    data::NullTokenizerOptions null_options;
    null_options.vocab_size = config.model.vocab_size;
    if (args.given("--null-tokenizer-eod-id")) null_options.eod_id = args.null_tokenizer_eod_id;
    null_options.pad_id = args.null_tokenizer_pad_id;
    const data::TokenizerIds ids = data::read_tokenizer_ids(tokenizer, null_options);
    if (tokenizer.type != TokenizerType::null_tokenizer) {
      // Megatron ignores --vocab-size beside a real tokenizer; tandem refuses a disagreeing one.
      checker.check(!args.given("--vocab-size") || config.model.vocab_size == ids.vocab_size, "--vocab-size",
                    std::to_string(config.model.vocab_size),
                    "differs from the " + std::to_string(ids.vocab_size) + " ids of --tokenizer-type " +
                        to_string(tokenizer.type) + " (the vocabulary size comes from the tokenizer, as in Megatron)",
                    "drop --vocab-size");
    }
    config.model.vocab_size = ids.vocab_size;
    tokenizer.eod_token = ids.eod_token;
    tokenizer.pad_token = ids.pad_token;
  } catch (const ConfigError& error) {
    for (const auto& issue : error.issues()) checker.fail(issue.field, issue.value, issue.rule, issue.fix);
  }
}

}  // namespace tandem::config_rules
