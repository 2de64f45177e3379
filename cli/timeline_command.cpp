// `tandem timeline LOG [--iteration N] [--svg FILE]`: a pipeline-parallel run's measured timeline
// (the pipeline_timeline records `tandem train --log-pipeline-timeline` writes): per stage its
// busy time and idle share, the whole step's idle fraction beside the plan's bubble
// (p - 1) / (v m + p - 1); --svg draws every stage as a row of forward and backward blocks with
// gnuplot (cli/gnuplot.hpp), like the seed's pipeline figure.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/gnuplot.hpp"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

struct TimelineCommandState {
  std::string log;
  std::int64_t iteration = 0;  // 0: the last timed iteration
  std::string svg;
};

// The log's pipeline_timeline record of `iteration` (0: the last one). A torn line (a killed run's
// last) is skipped as `tandem audit` skips it.
nlohmann::json find_timeline(const std::string& path, std::int64_t iteration) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("timeline: cannot read " + path + "; fix: name a log.jsonl that tandem train wrote");
  std::string line;
  nlohmann::json found;
  std::int64_t timed = 0;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object() || record.value("type", "") != "pipeline_timeline") continue;
    ++timed;
    if (iteration == 0 || record.value("iteration", std::int64_t{0}) == iteration) found = record;
  }
  if (found.is_null()) {
    throw std::runtime_error(
        timed == 0 ? "timeline: " + path + " holds no pipeline_timeline record; fix: train with "
                         "--pipeline-model-parallel-size > 1 and --log-pipeline-timeline"
                   : "timeline: " + path + " holds no timeline of iteration " + std::to_string(iteration) + " (" +
                         std::to_string(timed) + " timed iterations); fix: name one it holds, or drop --iteration");
  }
  return found;
}

std::string percent(double fraction) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return out.str();
}

// Forward blocks in blues, backward blocks in oranges, darker for later chunks.
std::string block_color(bool forward, std::int64_t chunk) {
  constexpr std::array<std::string_view, 4> forwards = {"#6fa8dc", "#3d85c6", "#0b5394", "#073763"};
  constexpr std::array<std::string_view, 4> backwards = {"#f6b26b", "#e69138", "#b45f06", "#783f04"};
  const auto shade = static_cast<std::size_t>(std::clamp<std::int64_t>(chunk, 0, 3));
  return std::string(forward ? forwards[shade] : backwards[shade]);
}

void draw_timeline(const nlohmann::json& record, const std::string& gnuplot, const fs::path& target) {
  const auto& stages = record.at("stages");
  const auto count = static_cast<std::int64_t>(stages.size());
  const double span = record.at("span_seconds").get<double>();
  const bool chunked = record.at("model_chunks_per_rank").get<std::int64_t>() > 1;
  draw_svg(gnuplot, target, 1200, 120 + 60 * static_cast<int>(count), [&](std::ostream& out, const fs::path&) {
    out << "set title " << gnuplot_quoted(
               "iteration " + std::to_string(record.at("iteration").get<std::int64_t>()) + ": " +
               std::to_string(count) + " stages x " + std::to_string(record.at("model_chunks_per_rank").get<std::int64_t>()) +
               " chunks, " + std::to_string(record.at("microbatches_per_replica").get<std::int64_t>()) +
               " microbatches; idle " + percent(record.at("idle_fraction").get<double>()) + " (plan's bubble " +
               percent(record.at("plan_idle_fraction").get<double>()) + "); forward blue, backward orange")
        << "\n"
        << "set xlabel 'seconds from the iteration''s start'\nunset key\nset grid xtics\n"
        << "set xrange [0:" << exact(span > 0 ? span : 1.0) << "]\n"
        << "set yrange [" << count << "-0.5:-0.5]\nset ytics (";
    for (std::int64_t stage = 0; stage < count; ++stage) {
      out << (stage > 0 ? ", " : "") << "'stage " << stage << "' " << stage;
    }
    out << ")\n";
    std::int64_t object = 1;
    for (std::int64_t stage = 0; stage < count; ++stage) {
      for (const auto& pass : stages[static_cast<std::size_t>(stage)].at("passes")) {
        const bool forward = pass.at(0).get<std::string>() == "F";
        const auto microbatch = pass.at(1).get<std::int64_t>();
        const auto chunk = pass.at(2).get<std::int64_t>();
        const double start = pass.at(3).get<double>();
        const double end = pass.at(4).get<double>();
        out << "set object " << object++ << " rectangle from " << exact(start) << "," << stage - 0.35 << " to "
            << exact(end) << "," << stage + 0.35 << " fillcolor rgb '" << block_color(forward, chunk)
            << "' fillstyle solid 1.0 border lc rgb 'white'\n";
        out << "set label " << gnuplot_quoted(std::to_string(microbatch) + (chunked ? "." + std::to_string(chunk) : ""))
            << " at " << exact((start + end) / 2) << "," << stage << " center font ',8' front\n";
      }
    }
    out << "plot NaN notitle\n";
  }, "--svg");
}

Command add_timeline_command(CLI::App& parent) {
  auto state = std::make_shared<TimelineCommandState>();
  CLI::App* sub = parent.add_subcommand(
      "timeline", "Show a pipeline-parallel run's measured timeline (train with --log-pipeline-timeline): each "
                  "stage's busy and idle time, the idle fraction beside the plan's bubble; optionally draw it as SVG");
  sub->add_option("log", state->log, "the run's JSON Lines log (SAVE/log.jsonl)")->required();
  sub->add_option("--iteration", state->iteration, "the iteration to show (default: the last timed one)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--svg", state->svg,
                  "draw the stages' forward and backward blocks into this SVG file with gnuplot (default: no "
                  "drawing)");
  Command command;
  command.app = sub;
  command.run = [state]() {
    const nlohmann::json record = find_timeline(state->log, state->iteration);
    const std::string gnuplot = state->svg.empty() ? "" : find_gnuplot("--svg");
    const double span = record.at("span_seconds").get<double>();
    std::cout << "iteration " << record.at("iteration").get<std::int64_t>() << ": "
              << record.at("pipeline_stages").get<std::int64_t>() << " pipeline stages x "
              << record.at("model_chunks_per_rank").get<std::int64_t>() << " model chunks, "
              << record.at("microbatches_per_replica").get<std::int64_t>() << " microbatches per replica, "
              << span << " s\n";
    for (const auto& stage : record.at("stages")) {
      const double busy = stage.at("busy_seconds").get<double>();
      std::cout << "  stage " << stage.at("stage").get<std::int64_t>() << ": " << stage.at("passes").size()
                << " passes, busy " << busy << " s, idle " << percent(span > 0 ? (span - busy) / span : 0.0) << "\n";
    }
    std::cout << "idle fraction " << percent(record.at("idle_fraction").get<double>()) << ", the plan's bubble "
              << percent(record.at("plan_idle_fraction").get<double>()) << " ((p-1)/(v m + p-1))\n";
    if (!state->svg.empty()) {
      draw_timeline(record, gnuplot, fs::path(state->svg));
      std::cerr << "wrote " << state->svg << "\n";
    }
    return 0;
  };
  return command;
}

}  // namespace

TANDEM_COMMAND(65, add_timeline_command);

}  // namespace tandem::cli
