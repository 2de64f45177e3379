// `tandem schedule [ARGS] [--every N] [--csv|--json] [--svg FILE]`: the learning-rate and weight-decay
// schedule every update uses (SPEC 8, 12), from core/schedule.hpp, assuming every update succeeds.
// --svg draws it with gnuplot (Debian's gnuplot-nox) run as a subprocess (cli/gnuplot.hpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/gnuplot.hpp"
#include "core/args.hpp"
#include "core/schedule.hpp"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

// Points per gnuplot panel: enough for a smooth curve, few enough for a small SVG.
constexpr std::int64_t kPlotPointsPerPanel = 2000;
// The warmup panel spans this multiple of the warmup (tokens), so the turn onto the decay shows.
constexpr double kWarmupPanelSpan = 1.5;
// Without warmup, the left panel shows this share of the run instead.
constexpr double kNoWarmupPanelShare = 0.02;

struct ScheduleCommandState {
  RunArguments run;
  std::int64_t every = 1;  // updates between printed rows
  bool csv = false;
  bool json = false;
  std::string svg;
};

// One row: the update, the scheduler position it starts at, and what it uses (SPEC 8).
struct ScheduleRow {
  std::int64_t update = 0;
  std::int64_t consumed_samples = 0;
  double lr = 0.0;
  double wd = 0.0;
};

ScheduleRow row_for(const RunConfig& config, std::int64_t update) {
  ScheduleRow row;
  row.update = update;
  // SPEC 12: consumed samples at the start of the update, every earlier update successful, so
  // they equal the scheduler's position (SPEC 8: update k uses lr((k-1) x GBS)).
  row.consumed_samples = scheduler_samples_before_update(update, config.batch.global_batch_size);
  row.lr = learning_rate<double>(config.schedule, row.consumed_samples);
  row.wd = weight_decay_at<double>(config.schedule, row.consumed_samples);
  return row;
}

// Updates 1, 1+N, 1+2N, ... and always the last.
std::vector<std::int64_t> selected_updates(std::int64_t total_updates, std::int64_t every) {
  std::vector<std::int64_t> updates;
  for (std::int64_t update = 1; update <= total_updates; update += every) updates.push_back(update);
  if (updates.empty() || updates.back() != total_updates) updates.push_back(total_updates);
  return updates;
}

// Tokens scaled to a readable unit for an axis whose largest value is `max_tokens`.
struct TokenUnit {
  double divisor;
  std::string name;
};
TokenUnit token_unit(double max_tokens) {
  if (max_tokens >= 1e12) return {1e12, "T"};
  if (max_tokens >= 1e9) return {1e9, "B"};
  if (max_tokens >= 1e6) return {1e6, "M"};
  if (max_tokens >= 1e3) return {1e3, "K"};
  return {1.0, ""};
}

// Writes "tokens lr" for about kPlotPointsPerPanel updates in [1, last_update], plus `extra`.
void write_panel_data(const fs::path& file, const RunConfig& config, std::int64_t last_update,
                      std::int64_t extra_update, double divisor) {
  std::ofstream out(file);
  const std::int64_t stride = std::max<std::int64_t>(1, last_update / kPlotPointsPerPanel);
  std::vector<std::int64_t> updates = selected_updates(last_update, stride);
  if (extra_update >= 1 && extra_update <= last_update) updates.push_back(extra_update);
  std::sort(updates.begin(), updates.end());
  updates.erase(std::unique(updates.begin(), updates.end()), updates.end());
  for (const std::int64_t update : updates) {
    const ScheduleRow row = row_for(config, update);
    const double tokens =
        static_cast<double>(row.consumed_samples) * static_cast<double>(config.model.seq_length);
    out << exact(tokens / divisor) << ' ' << exact(row.lr) << '\n';
  }
  if (!out) throw std::runtime_error("--svg: could not write plot data to " + file.string());
}

// Draws the schedule into `target` (gnuplot.hpp draw_svg: atomically).
void draw_schedule_svg(const RunConfig& config, const std::string& gnuplot, const fs::path& target) {
  draw_svg(gnuplot, target, 1100, 420, [&](std::ostream& out, const fs::path& scratch) {
    const std::int64_t gbs = config.batch.global_batch_size;
    const std::int64_t total_updates = config.train_updates();
    const std::int64_t warmup_updates =
        (config.schedule.lr_warmup_samples + gbs - 1) / gbs;  // updates below the peak
    const std::int64_t warmup_panel_updates = std::clamp<std::int64_t>(
        warmup_updates > 0
            ? static_cast<std::int64_t>(kWarmupPanelSpan * static_cast<double>(warmup_updates))
            : static_cast<std::int64_t>(kNoWarmupPanelShare * static_cast<double>(total_updates)),
        std::min<std::int64_t>(2, total_updates), total_updates);
    const double tokens_per_update = static_cast<double>(config.tokens_per_update());
    const TokenUnit warmup_unit =
        token_unit(tokens_per_update * static_cast<double>(warmup_panel_updates));
    const TokenUnit run_unit = token_unit(tokens_per_update * static_cast<double>(total_updates));

    const fs::path warmup_data = scratch / "warmup.dat";
    const fs::path run_data = scratch / "run.dat";
    write_panel_data(warmup_data, config, warmup_panel_updates, warmup_updates + 1,
                     warmup_unit.divisor);
    write_panel_data(run_data, config, total_updates, warmup_updates + 1, run_unit.divisor);
    out << "set multiplot layout 1,2 title " << gnuplot_quoted(
               "learning rate by input tokens (" + to_string(config.schedule.lr_decay_style) +
               " decay, " + std::to_string(warmup_updates) + " warmup updates)") << "\n"
        << "set grid\nset key off\nset format y '%.1e'\nset ylabel 'learning rate'\n"
        << "set title 'warmup, enlarged'\n"
        << "set xlabel " << gnuplot_quoted("input tokens (" + warmup_unit.name + ")") << "\n"
        << "plot " << gnuplot_quoted(warmup_data.string())
        << " using 1:2 with lines linewidth 2 linecolor rgb '#1f5fa8'\n"
        << "set title 'whole run'\n"
        << "set xlabel " << gnuplot_quoted("input tokens (" + run_unit.name + ")") << "\n"
        << "plot " << gnuplot_quoted(run_data.string())
        << " using 1:2 with lines linewidth 2 linecolor rgb '#1f5fa8'\n"
        << "unset multiplot\n";
  }, "--svg");
}

Command add_schedule_command(CLI::App& parent) {
  auto state = std::make_shared<ScheduleCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "schedule", "Print the lr and wd every update uses, assuming every update succeeds "
                  "(SPEC 8); optionally draw it as SVG");
  add_run_options(*sub, state->run);
  const std::string group = "Schedule output";
  sub->add_option("--every", state->every,
                  "print every N-th update, always the first and the last (updates; default: 1)")
      ->check(at_least_one())
      ->group(group);
  CLI::Option* csv = sub->add_flag(
      "--csv", state->csv,
      "print CSV with header update,consumed_samples,lr,wd (samples; the default output)")
      ->group(group);
  sub->add_flag("--json", state->json,
                "print a JSON array of {update, consumed_samples, lr, wd} (samples; default: CSV)")
      ->excludes(csv)
      ->group(group);
  sub->add_option("--svg", state->svg,
                  "draw lr against input tokens into this SVG file with gnuplot (tokens; "
                  "default: no drawing)")
      ->group(group);

  Command command;
  command.app = sub;
  command.run = [state]() {
    LaunchContext launch;
    launch.needs_architecture = false;  // the schedule reads batch and schedule options only
    const RunConfig config = build_run_config(state->run, launch);  // ConfigError -> exit 2 in main

    std::optional<std::string> gnuplot;
    if (!state->svg.empty()) gnuplot = find_gnuplot("--svg");

    const bool print_rows = state->csv || state->json || state->svg.empty();
    if (print_rows) {
      const std::vector<std::int64_t> updates =
          selected_updates(config.train_updates(), state->every);
      if (state->json) {
        nlohmann::json rows = nlohmann::json::array();
        for (const std::int64_t update : updates) {
          const ScheduleRow row = row_for(config, update);
          rows.push_back({{"update", row.update},
                          {"consumed_samples", row.consumed_samples},
                          {"lr", row.lr},
                          {"wd", row.wd}});
        }
        std::cout << rows.dump(1) << "\n";
      } else {
        std::string text = "update,consumed_samples,lr,wd\n";  // SPEC 12
        for (const std::int64_t update : updates) {
          const ScheduleRow row = row_for(config, update);
          text += std::to_string(row.update) + ',' + std::to_string(row.consumed_samples) + ',' +
                  exact(row.lr) + ',' + exact(row.wd) + '\n';
        }
        std::cout << text;
      }
    }
    if (gnuplot) {
      draw_schedule_svg(config, *gnuplot, fs::path(state->svg));
      std::cerr << "wrote " << state->svg << "\n";
    }
    return 0;
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(20, add_schedule_command);

}  // namespace tandem::cli
