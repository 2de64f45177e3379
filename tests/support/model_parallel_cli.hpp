// What the tensor- and pipeline-parallel command-line tests share
// (tests/production_tensor_parallel_cli_test.cpp, production_pipeline_parallel_cli_test.cpp): the
// tiny run on the production cpu backend, the export that must hold the checkpoint's tensors, a
// checkpoint taken up by other layouts, and the refusal of model-parallel ranks without a launcher.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/safetensors.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem::testing {

class ModelParallelCli : public TinyTrainCli {
 protected:
  // A layout a checkpoint is taken up at: its name (the copy's folder), launcher and options.
  struct Layout {
    std::string name;
    std::string launcher;
    std::vector<std::string> options;
  };

  // The tiny run on the production cpu backend.
  std::vector<std::string> tiny(const std::vector<std::string>& extra) const {
    return tiny_train({"--engine", "production", "--device", "cpu"}, extra);
  }
  static std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // Exports the checkpoint `saved_at` into ROOT/hf and reads the export into `hf`; each exported tensor must be
  // the checkpoint's. A failed export is fatal: call it under ASSERT_NO_FATAL_FAILURE.
  void expect_export_holds_the_checkpoint(const std::filesystem::path& saved_at,
                                          checkpoint::SafetensorsContents& hf) const {
    const auto exported = run_tandem({"export", "--load", saved_at.string(), "--hf", (root_ / "hf").string()}, "", "2>&1");
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    hf = checkpoint::read_safetensors(root_ / "hf" / "model.safetensors");
    const auto saved = checkpoint::load_checkpoint(saved_at);
    for (const auto& tensor : saved.model_tensors) {
      EXPECT_EQ(checkpoint::find_tensor(hf.tensors, tensor.name, "export"), tensor) << tensor.name;
    }
  }

  // Each layout takes up a copy of the checkpoint folder `half` (written at iteration 3) and
  // trains it to the end: it must say it resumed and save iteration 6.
  void expect_resumes_on(const std::filesystem::path& half, const std::vector<Layout>& layouts) const {
    for (const Layout& layout : layouts) {
      const auto copy = root_ / layout.name;
      std::filesystem::copy(half, copy, std::filesystem::copy_options::recursive);
      const auto resumed = run_tandem(tiny(joined(layout.options, {"--load", copy.string(), "--save", copy.string()})),
                                      layout.launcher, "2>&1");
      EXPECT_EQ(resumed.exit_code, 0) << layout.name << ": " << resumed.output;
      EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << layout.name << ": " << resumed.output;
      EXPECT_TRUE(std::filesystem::exists(copy / "iter_0000006")) << layout.name;
    }
  }

  // One process asked for 2 model-parallel ranks by `option` is refused with the command that runs it.
  void expect_two_ranks_refused_without_a_launcher(const std::string& option) const {
    const auto result = run_tandem(tiny({option, "2"}), "", "2>&1");
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("mpirun -np 2"), std::string::npos) << result.output;
  }
};

}  // namespace tandem::testing
