// gnuplot (Debian's gnuplot-nox) run as a subprocess to draw SVG files: `tandem schedule --svg`
// and `tandem timeline --svg`.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <string>

namespace tandem::cli {

// The gnuplot on PATH; throws std::runtime_error naming `option` and the fix when there is none.
std::string find_gnuplot(const std::string& option);

// A gnuplot single-quoted string: '' stands for one quote inside it.
std::string gnuplot_quoted(const std::string& text);

// Shortest text that reads back as the same double.
std::string exact(double value);

// Draws `target` atomically: `commands(script, scratch)` writes the plot commands (and any data
// files into the scratch directory) after `set terminal svg size WIDTH,HEIGHT ...` and `set
// output`; gnuplot writes a temporary file beside the target, renamed over it only when gnuplot
// succeeded and the SVG is complete. Nothing is written otherwise (std::runtime_error naming
// `option`).
void draw_svg(const std::string& gnuplot, const std::filesystem::path& target, int width, int height,
              const std::function<void(std::ostream& script, const std::filesystem::path& scratch)>& commands,
              const std::string& option);

}  // namespace tandem::cli
