// `tandem export --hf` computes the same function in Hugging Face transformers as the reference:
// the exported model's logits (LlamaForCausalLM in float64, RoPE tables in float32 as transformers
// makes them) equal the reference's forward_logits in double on one window. Names, shapes, RoPE's rotate-half pairing, GQA's repeat_kv, RMSNorm's
// epsilon and SwiGLU's gate all have to be right for that. transformers runs in a virtual
// environment under the build directory that tests/hf/transformers_env.py makes on first use
// (Debian's torch 1.13 from ci/lib.sh, transformers 4.44.2 and its pinned dependencies from PyPI);
// without them the test fails, it never skips.
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/main_state.hpp"
#include "core/data/packing.hpp"
#include "core/init.hpp"
#include "reference/model.hpp"
#include "tests/support/run_tandem.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The command with its stderr, through /bin/sh.
testing::CommandResult run_shell(const std::string& command) { return testing::run_shell(command + " 2>&1"); }

// 2 layers, width 64, 4 heads in 2 groups (GQA), biases off, untied; a large init std so the
// logits are far from uniform and every part of the network matters.
RunConfig exported_run(bool tie_embeddings) {
  RunConfig config;
  config.model.num_layers = 2;
  config.model.hidden_size = 64;
  config.model.ffn_hidden_size = 128;
  config.model.num_attention_heads = 4;
  config.model.num_query_groups = 2;
  config.model.seq_length = 12;
  config.model.padded_vocab_size = 384;
  config.model.init_method_std = 0.2;
  config.model.tie_embeddings = tie_embeddings;
  return config;
}

class ExportToTransformers : public ::testing::TestWithParam<bool> {};

TEST_P(ExportToTransformers, LogitsEqualTheReferenceForward) {
  // The environment's python is the last line the script prints.
  const auto environment =
      run_shell("/usr/bin/python3 " + testing::shell_quoted(TANDEM_SOURCE_DIR "/tests/hf/transformers_env.py") + " " +
                testing::shell_quoted(TANDEM_TRANSFORMERS_VENV));
  ASSERT_EQ(environment.exit_code, 0) << "no python with torch and the pinned transformers:\n"
                                      << environment.output;
  std::string python = environment.output;
  while (!python.empty() && python.back() == '\n') python.pop_back();
  python = python.substr(python.rfind('\n') + 1);  // npos + 1 = 0: a one-line output
  const RunConfig config = exported_run(GetParam());
  const ModelLayout layout = make_model_layout(config.model);
  const std::vector<float> initial = initial_parameters(config.model, /*seed=*/7);
  MainState<double> state;
  state.params.assign(initial.begin(), initial.end());  // fp32 values widened exactly
  state.exp_avg.assign(state.params.size(), 0.0);
  state.exp_avg_sq.assign(state.params.size(), 0.0);

  // One window of a single document (no EOD inside): Hugging Face's plain causal attention and
  // positions 0..L-1 are then exactly SPEC 3's (reset masks change nothing here).
  const std::vector<std::int32_t> window = {72, 101, 108, 108, 111, 44, 32, 116, 97, 110, 100, 101, 109};
  const Sample sample = data::build_sample(0, window, data::MaskRules{});
  const std::vector<double> logits =  // [seq, padded_vocab]
      reference::forward_logits<double>(config.model, layout, state.params, sample);

  const fs::path root = fs::temp_directory_path() /
                        ("tandem_export_hf_" + std::to_string(::getpid()) + "_" +
                         std::to_string(GetParam()));
  fs::remove_all(root);
  checkpoint::save_checkpoint(root / "save",
                              checkpoint::make_main_checkpoint("reference", config, layout, state));
  const auto exported = testing::run_tandem(
      {"export", "--load", (root / "save").string(), "--hf", (root / "hf").string()}, "", "2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;

  std::ofstream(root / "logits.py") << R"PY(
import json, sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float64).eval()
ids = torch.tensor([json.loads(sys.argv[2])])
with torch.no_grad():
    print(json.dumps(model(ids).logits[0].reshape(-1).tolist()))
)PY";
  nlohmann::json inputs = sample.tokens;
  const auto result = run_shell(testing::shell_quoted(python) + " " + testing::shell_quoted((root / "logits.py").string()) +
                                " " + testing::shell_quoted((root / "hf").string()) + " " +
                                testing::shell_quoted(inputs.dump()) + " 2>/dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string last_line = result.output.substr(result.output.rfind('[', std::string::npos));
  const auto hf_logits = nlohmann::json::parse(last_line).get<std::vector<double>>();
  ASSERT_EQ(hf_logits.size(), logits.size());

  // Comparison: approximate. Both sides run in double from the same fp32 weights, except that
  // transformers computes RoPE's frequencies and cos/sin in float32 (LlamaRotaryEmbedding forces
  // it). Each of its cos/sin then carries a relative error <= (2|theta| + 1) u32 with theta <=
  // (L - 1) = 11 radians: 23 u32. A rotated q or k element mixes two such products: 2 x 23 u32.
  // Two layers, q and k each: 4 x 2 x 23 u32 = 184 u32 relative on the scores, assumed (first
  // order, gain 1 at this initialization) to reach the logits as 184 u32 x max|logit|. The double
  // evaluation-order differences (~1e-13 relative) are negligible beside it.
  double max_logit = 0;
  for (const double value : logits) max_logit = std::max(max_logit, std::abs(value));
  const double bound = 184 * std::ldexp(1.0, -24) * max_logit;
  double worst = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(hf_logits[i])) << i;
    worst = std::max(worst, std::abs(hf_logits[i] - logits[i]));
    ASSERT_LE(std::abs(hf_logits[i] - logits[i]), bound)
        << "logit " << i << ": reference " << logits[i] << ", transformers " << hf_logits[i];
  }
  // Negative control: the same comparison rejects the reference with one query weight of layer 0
  // moved by 1e-3 (a wrong tensor mapping moves far more than that).
  std::vector<double> perturbed = state.params;
  perturbed[static_cast<std::size_t>(layout.offset_of(layout.layers.at(0).q_weight))] += 1e-3;
  const std::vector<double> control =
      reference::forward_logits<double>(config.model, layout, perturbed, sample);
  double control_worst = 0;
  for (std::size_t i = 0; i < control.size(); ++i) {
    control_worst = std::max(control_worst, std::abs(hf_logits[i] - control[i]));
  }
  EXPECT_GT(control_worst, bound);
  std::cout << "worst |transformers - reference| = " << worst << " (bound " << bound
            << ", max |logit| " << max_logit << ", control " << control_worst << ")\n";
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, ExportToTransformers, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

}  // namespace
}  // namespace tandem
