// gnuplot run as a subprocess (gnuplot.hpp).
#include "cli/gnuplot.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::stringstream directories(path);
  std::string directory;
  while (std::getline(directories, directory, ':')) {
    if (directory.empty()) continue;
    const fs::path candidate = fs::path(directory) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return std::nullopt;
}

// Removes a directory tree when it goes out of scope.
struct ScratchDirectory {
  fs::path path;
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

std::string find_gnuplot(const std::string& option) {
  if (std::optional<std::string> gnuplot = find_on_path("gnuplot")) return *gnuplot;
  throw std::runtime_error(option + " needs gnuplot, which is not on PATH; fix: install it (Debian: apt-get install "
                           "gnuplot-nox), or drop " + option);
}

std::string gnuplot_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

std::string exact(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

void draw_svg(const std::string& gnuplot, const fs::path& target, int width, int height,
              const std::function<void(std::ostream& script, const fs::path& scratch)>& commands,
              const std::string& option) {
  std::string scratch_template = (fs::temp_directory_path() / "tandem-plot-XXXXXX").string();
  if (::mkdtemp(scratch_template.data()) == nullptr) {
    throw std::runtime_error(option + ": could not create a scratch directory under " +
                             fs::temp_directory_path().string());
  }
  const ScratchDirectory scratch{scratch_template};
  const fs::path temporary =
      target.parent_path() / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const fs::path script = scratch.path / "plot.gp";
  {
    std::ofstream out(script);
    out << "set terminal svg size " << width << "," << height
        << " dynamic enhanced font 'sans,11' background rgb 'white'\n"
        << "set output " << gnuplot_quoted(temporary.string()) << "\n";
    commands(out, scratch.path);
    out << "set output\n";
    if (!out) throw std::runtime_error(option + ": could not write " + script.string());
  }
  const std::string script_text = script.string();
  std::vector<char*> argv = {const_cast<char*>(gnuplot.c_str()), const_cast<char*>(script_text.c_str()), nullptr};
  pid_t child = 0;
  if (::posix_spawn(&child, gnuplot.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error(option + ": could not start " + gnuplot);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  std::error_code ignored;
  const bool succeeded = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  bool complete = false;
  if (succeeded) {
    std::ifstream in(temporary);
    std::stringstream content;
    content << in.rdbuf();
    complete = content.str().find("</svg>") != std::string::npos;
  }
  if (!succeeded || !complete) {
    fs::remove(temporary, ignored);
    throw std::runtime_error(option + ": gnuplot failed to draw " + target.string() +
                             " (its messages are above); nothing was written");
  }
  fs::rename(temporary, target);
}

}  // namespace tandem::cli
