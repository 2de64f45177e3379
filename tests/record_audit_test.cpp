// `tandem audit`'s exact checks of every record (issue 15 item 3; reference/record_audit.hpp),
// through the real binary on real logs of the tiny run (tests/support/tiny_train_cli.hpp):
//   - it passes on logs of both engines, fp32 and bf16 (production), double and float50
//     (reference), clipping on and off, with a skipped update, with padding (unit packing), on the
//     golden float50 trajectory, and on a resumed run's log (held to its checkpoint's record);
//   - each check fails when one field of one record is edited, naming the iteration, the field,
//     both values and the rule (a negative control per check);
//   - the planted bug of issue 15, the clip coefficient computed as clip / norm without SPEC 6's
//     +1e-6 (a relative error of about 1e-6 that no precision bound sees), fails the audit on every
//     clipped record, on production fp32 and bf16 logs and on the golden float50 reference log.
// Kind of comparison: exact (the audit recomputes each engine's own arithmetic bit for bit).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/files.hpp"
#include "tests/support/run_tandem.hpp"
#include "tests/support/tiny_train_cli.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::read_log;
using testing::run_tandem;

// The tiny run's gradient norms (about 1.41 to 1.71 over its 6 updates) straddle this threshold,
// so its logs hold clipped and unclipped updates both (each test checks that they do).
const std::string kClip = "1.6";
// The float50 reference trains 3 updates (about 4 s each here, where double takes milliseconds);
// update 2 clips, 1 and 3 do not. A later option overrides the tiny run's --train-samples 24.
const fs::path kGoldenFloat50 = fs::path(TANDEM_SOURCE_DIR) / "fixtures" / "golden" / "tiny_float50.jsonl";
const std::vector<std::string> kFloat50 = {"--reference-precision", "float50", "--train-samples", "12"};

class RecordAudit : public testing::TinyTrainCli {
 protected:
  // Trains the tiny run with ENGINE words and EXTRA into ROOT/NAME.jsonl; returns the log's path.
  fs::path train(const std::string& name, const std::vector<std::string>& engine, std::vector<std::string> extra) {
    const fs::path log = root_ / (name + ".jsonl");
    extra.insert(extra.end(), {"--log", log.string()});
    const auto result = run_tandem(tiny_train(engine, extra), "", "2>&1");
    EXPECT_EQ(result.exit_code, 0) << name << ": " << result.output;
    return log;
  }
  static std::vector<std::string> production() { return {"--engine", "production", "--device", "cpu"}; }
  static std::vector<std::string> reference() { return {"--engine", "reference"}; }
  static std::vector<std::string> with(std::vector<std::string> words, const std::vector<std::string>& more) {
    words.insert(words.end(), more.begin(), more.end());
    return words;
  }

  static testing::CommandResult audit(const fs::path& log) { return run_tandem({"audit", log.string()}, "", "2>&1"); }

  // The log's records with `edit` applied, written to ROOT/NAME.jsonl.
  fs::path edited(const fs::path& log, const std::string& name,
                  const std::function<void(std::vector<nlohmann::json>&)>& edit) const {
    auto records = read_log(log);
    edit(records);
    const fs::path out = root_ / (name + ".jsonl");
    std::ofstream file(out);
    for (const auto& record : records) file << record.dump() << "\n";
    return out;
  }

  // What the logs cover: clipped, unclipped successful and skipped updates.
  struct Coverage {
    int clipped = 0;
    int unclipped = 0;
    int skipped = 0;
  };
  static Coverage coverage(const fs::path& log) {
    Coverage c;
    for (const auto& record : read_log(log)) {
      if (record.value("type", "") != "iteration") continue;
      if (!record["update_successful"].get<bool>()) {
        ++c.skipped;
      } else if (record["clipped"].get<bool>()) {
        ++c.clipped;
      } else {
        ++c.unclipped;
      }
    }
    return c;
  }
};

TEST_F(RecordAudit, PassesOnRealLogsOfBothEnginesBothPrecisionsClippingOnAndOffAndASkippedUpdate) {
  struct Case {
    std::string name;
    std::vector<std::string> engine;
    std::vector<std::string> extra;
  };
  const std::vector<Case> cases = {
      {"production-fp32-skip", production(), {"--clip-grad", kClip, "--test-nonfinite-gradient-iterations", "3"}},
      {"production-bf16", production(), {"--clip-grad", kClip, "--bf16"}},
      {"production-fp32-noclip", production(), {"--clip-grad", "0"}},
      {"reference-double-skip", reference(), {"--clip-grad", kClip, "--test-nonfinite-loss-iterations", "4"}},
      {"reference-float50", reference(), with({"--clip-grad", kClip}, kFloat50)},
      {"reference-double-units-noclip", reference(), {"--clip-grad", "0", "--packing", "units"}},
  };
  Coverage total;
  for (const Case& c : cases) {
    const fs::path log = train(c.name, c.engine, c.extra);
    const auto result = audit(log);
    EXPECT_EQ(result.exit_code, 0) << c.name << ": " << result.output;
    EXPECT_NE(result.output.find("records: every record is self-consistent"), std::string::npos) << c.name << ": " << result.output;
    const Coverage covered = coverage(log);
    if (c.name.ends_with("skip")) {
      EXPECT_EQ(covered.skipped, 1) << c.name;
    }
    if (c.name.find("noclip") != std::string::npos) {
      EXPECT_EQ(covered.clipped, 0) << c.name;
    } else {
      EXPECT_GT(covered.clipped, 0) << c.name << ": no update clipped";
    }
    total.clipped += covered.clipped;
    total.unclipped += covered.unclipped;
    total.skipped += covered.skipped;
  }
  // The clip threshold sits inside the norms' range, so both decisions were checked with it on.
  const Coverage clipping_on = coverage(root_ / "production-fp32-skip.jsonl");
  EXPECT_GT(clipping_on.unclipped, 0) << "every update clipped: the threshold " << kClip << " no longer splits the norms";
  EXPECT_EQ(total.skipped, 2);
  // Unit packing pads: the token check saw pad_tokens > 0.
  std::int64_t padded = 0;
  for (const auto& record : read_log(root_ / "reference-double-units-noclip.jsonl")) padded += record.value("pad_tokens", 0);
  EXPECT_GT(padded, 0) << "the unit-packed run has no padding; the pad-token check went unexercised";
}

// The golden float50 trajectory (fixtures/golden/: 8 updates, clipping at 1.4 on from update 4,
// update 5 skipped), a real reference log with a provenance record first.
TEST_F(RecordAudit, PassesOnTheGoldenFloat50Trajectory) {
  const auto result = audit(kGoldenFloat50);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("records: every record is self-consistent"), std::string::npos) << result.output;
  const Coverage covered = coverage(kGoldenFloat50);
  EXPECT_GT(covered.clipped, 0);
  EXPECT_GT(covered.unclipped, 0);
  EXPECT_EQ(covered.skipped, 1);
}

// A run stopped at iteration 2 and resumed appends a header (resumed_from_iteration 2) and
// records 3..6 to the same log: the records after it continue from record 2's counters.
TEST_F(RecordAudit, AResumedRunsRecordsContinueFromItsCheckpointsRecord) {
  const fs::path save = root_ / "ckpt";
  const fs::path log = save / "log.jsonl";
  const std::vector<std::string> clip = {"--clip-grad", kClip};
  ASSERT_EQ(run_tandem(tiny_train(reference(), with(with(clip, {"--save", save.string()}), {"--exit-interval", "2"}))).exit_code, 0);
  ASSERT_EQ(run_tandem(tiny_train(reference(), with(clip, {"--load", save.string(), "--save", save.string()}))).exit_code, 0);
  const auto records = read_log(log);
  ASSERT_EQ(records.size(), 1u + 2u + 1u + 4u);  // header, 2 records, header, 4 records
  ASSERT_EQ(records[3]["type"], "header");
  ASSERT_EQ(records[3]["resumed_from_iteration"], 2);
  const auto result = audit(log);
  EXPECT_EQ(result.exit_code, 0) << result.output;

  // Iteration 3's counters are held to record 2's: one more consumed sample is named.
  const fs::path tampered = edited(log, "resumed-edited", [](std::vector<nlohmann::json>& rs) {
    rs.at(4)["consumed_samples"] = rs.at(4)["consumed_samples"].get<std::int64_t>() + 1;
  });
  const auto refused = audit(tampered);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("iter 3 (line 5) consumed_samples: logged "), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("(previous record: iteration 2)"), std::string::npos) << refused.output;
}

// One edit of one field of one record, and the field audit must name.
struct Edit {
  std::string what;        // the edit, for the failure message
  std::string field;       // the field audit must name
  std::size_t index;       // the record (0 is the header)
  std::function<void(nlohmann::json&)> apply;
};

double next_up(double value) { return std::nextafter(value, std::numeric_limits<double>::infinity()); }

TEST_F(RecordAudit, EachCheckFailsWhenOneFieldOfOneRecordIsEditedAndNamesIt) {
  // Production fp32 with clipping and a skipped update at iteration 3 (record 3).
  const fs::path log = train("production", production(), {"--clip-grad", kClip, "--test-nonfinite-gradient-iterations", "3"});
  ASSERT_EQ(audit(log).exit_code, 0) << audit(log).output;  // the unedited log passes
  const auto records = read_log(log);
  ASSERT_EQ(records.size(), 1u + 6u);
  ASSERT_FALSE(records[3]["update_successful"].get<bool>());
  std::size_t clipped_index = 0;
  std::size_t unclipped_index = 0;
  for (std::size_t i = 1; i < records.size(); ++i) {
    if (!records[i]["update_successful"].get<bool>()) continue;
    (records[i]["clipped"].get<bool>() ? clipped_index : unclipped_index) = i;
  }
  ASSERT_NE(clipped_index, 0u) << "no clipped update in the log";
  ASSERT_NE(unclipped_index, 0u) << "no unclipped update in the log";

  const auto up = [](const char* field) {
    return [field](nlohmann::json& r) { r[field] = next_up(r[field].get<double>()); };
  };
  const auto plus = [](const char* field, std::int64_t delta) {
    return [field, delta](nlohmann::json& r) { r[field] = r[field].get<std::int64_t>() + delta; };
  };
  const std::vector<Edit> edits = {
      {"clip_coeff one ulp up on a clipped update", "clip_coeff", clipped_index, up("clip_coeff")},
      {"clip_coeff below 1 on an unclipped update", "clip_coeff", unclipped_index,
       [](nlohmann::json& r) { r["clip_coeff"] = 0.5; }},
      {"clip_coeff not 1 on the skipped update", "clip_coeff", 3, [](nlohmann::json& r) { r["clip_coeff"] = 0.5; }},
      {"clipped false on a clipped update", "clipped", clipped_index, [](nlohmann::json& r) { r["clipped"] = false; }},
      {"clipped true on an unclipped update", "clipped", unclipped_index, [](nlohmann::json& r) { r["clipped"] = true; }},
      {"grad_norm 1e-12 relative up on a clipped update (its coefficient no longer follows)", "clip_coeff",
       clipped_index, [](nlohmann::json& r) { r["grad_norm"] = r["grad_norm"].get<double>() * (1 + 1e-12); }},
      {"lr one ulp up", "lr", 5, up("lr")},
      {"wd one ulp up", "wd", 5, up("wd")},
      {"lr of the skipped update: a later n's", "lr", 3,
       [&records](nlohmann::json& r) { r["lr"] = records[5]["lr"]; }},
      {"step + 1", "step", 4, plus("step", 1)},
      {"iteration + 1", "iteration", 4, plus("iteration", 1)},
      {"consumed_samples + 1", "consumed_samples", 4, plus("consumed_samples", 1)},
      {"successful_updates + 1 (and step with it)", "successful_updates", 4,
       [](nlohmann::json& r) {
         r["successful_updates"] = r["successful_updates"].get<std::int64_t>() + 1;
         r["step"] = r["successful_updates"];
       }},
      {"skipped_updates + 1", "skipped_updates", 4, plus("skipped_updates", 1)},
      {"scheduler_samples advanced on the skipped update", "scheduler_samples", 3, plus("scheduler_samples", 4)},
      {"total_input_tokens + 1", "total_input_tokens", 4, plus("total_input_tokens", 1)},
      {"total_loss_tokens - 1", "total_loss_tokens", 4, plus("total_loss_tokens", -1)},
      {"total_pad_tokens + 1", "total_pad_tokens", 4, plus("total_pad_tokens", 1)},
      {"input_tokens - 1 (a position neither token nor padding)", "input_tokens", 2, plus("input_tokens", -1)},
      {"loss_tokens above input_tokens", "loss_tokens", 2,
       [](nlohmann::json& r) { r["loss_tokens"] = r["input_tokens"].get<std::int64_t>() + 1; }},
      {"update_successful on a non-finite norm", "update_successful", 3,
       [](nlohmann::json& r) { r["update_successful"] = true; }},
  };
  int name = 0;
  for (const Edit& edit : edits) {
    SCOPED_TRACE(edit.what);
    const fs::path tampered = edited(log, "edit" + std::to_string(name++), [&](std::vector<nlohmann::json>& rs) {
      edit.apply(rs.at(edit.index));
    });
    const auto result = audit(tampered);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    // "iter K (line L) FIELD: logged X, expected Y  MISMATCH" then "rule: ...".
    const std::int64_t logged_iteration =
        records[edit.index]["iteration"].get<std::int64_t>() + (edit.field == "iteration" ? 1 : 0);
    const std::string named = "iter " + std::to_string(logged_iteration) + " (line " + std::to_string(edit.index + 1) +
                              ") " + edit.field + ": logged ";
    EXPECT_NE(result.output.find(named), std::string::npos) << "expected \"" << named << "\" in:\n" << result.output;
    EXPECT_NE(result.output.find("rule: "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("verdict: MISMATCH"), std::string::npos) << result.output;
  }
}

// Issue 15's planted bug: production computing clip / norm instead of clip / (norm + 1e-6). The
// record it writes has the same grad_norm and the coefficient clip / grad_norm: edited so here
// on every clipped record, as the bug would log it.
TEST_F(RecordAudit, CatchesTheClipCoefficientComputedWithoutTheEpsilon) {
  for (const auto& [name, log] : std::vector<std::pair<std::string, fs::path>>{
           {"production-fp32", train("production-fp32", production(), {"--clip-grad", kClip})},
           {"production-bf16", train("production-bf16", production(), {"--clip-grad", kClip, "--bf16"})},
           {"golden-float50", kGoldenFloat50}}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(audit(log).exit_code, 0);
    std::vector<std::pair<std::int64_t, std::size_t>> clipped;  // iteration, line
    double largest_relative_change = 0;
    const fs::path buggy = edited(log, name + "-no-epsilon", [&](std::vector<nlohmann::json>& records) {
      double clip = 0;
      for (std::size_t index = 0; index < records.size(); ++index) {
        nlohmann::json& record = records[index];
        if (record.value("type", "") == "header") clip = record["config"]["optimizer"]["clip_grad"].get<double>();
        if (record.value("type", "") != "iteration" || !record["clipped"].get<bool>()) continue;
        const double norm = record["grad_norm"].get<double>();
        const double without_epsilon = clip / norm;  // the bug
        largest_relative_change = std::max(largest_relative_change,
                                           std::abs(without_epsilon / record["clip_coeff"].get<double>() - 1));
        record["clip_coeff"] = without_epsilon;
        clipped.emplace_back(record["iteration"].get<std::int64_t>(), index + 1);
      }
    });
    ASSERT_FALSE(clipped.empty()) << "no clipped update: the bug would not show";
    // The bug's size: about 1e-6 / norm relative, far inside any precision bound of the harness.
    EXPECT_LT(largest_relative_change, 1e-5);
    const auto result = audit(buggy);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    for (const auto& [iteration, line] : clipped) {
      const std::string named = "iter " + std::to_string(iteration) + " (line " + std::to_string(line) + ") clip_coeff: logged ";
      EXPECT_NE(result.output.find(named), std::string::npos) << "expected \"" << named << "\" in:\n" << result.output;
    }
  }
}

}  // namespace
}  // namespace tandem
