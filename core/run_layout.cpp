#include "core/run_layout.hpp"

namespace tandem {

RunLayout::RunLayout(const RunConfig& config)
    : grid(config.parallel), stages(pipeline_split(config.model, config.parallel)) {}

}  // namespace tandem
