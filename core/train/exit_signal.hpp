// Megatron's --exit-signal-handler: SIGTERM (what Slurm sends before a job's time limit and what
// `scancel` sends; `#SBATCH --signal=TERM@120` asks for it two minutes early) sets a flag instead
// of ending the process. The training loop (run_support.hpp) looks at the flag after every
// iteration, on every rank together, saves a checkpoint and exits 0, so a preempted run loses at
// most one iteration and resumes bit-exactly with --load.
#pragma once

namespace tandem {

// Installs the SIGTERM handler (idempotent). Throws std::runtime_error when sigaction fails.
void install_exit_signal_handler();

// Whether SIGTERM arrived since the handler was installed (or since clear_exit_signal).
bool exit_signal_received();

// Forgets a received signal (tests that raise SIGTERM more than once in one process).
void clear_exit_signal();

}  // namespace tandem
