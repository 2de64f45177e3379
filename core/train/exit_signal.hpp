// Megatron's --exit-signal-handler: SIGTERM (what Slurm sends before a job's time limit and what
// `scancel` sends; `#SBATCH --signal=TERM@120` asks for it two minutes early) sets a flag instead
// of ending the process. The training loop (run_support.hpp) looks at the flag after every
// iteration, on every rank together, saves a checkpoint and exits 0, so a preempted run loses at
// most one iteration and resumes bit-exactly with --load. SIGINT (Ctrl-C) is handled alike, and
// so is SIGUSR1: Open MPI's mpirun forwards SIGUSR1 to every rank and leaves them running, where a
// SIGTERM to mpirun kills the ranks a few seconds after forwarding it (so under mpirun, send
// SIGUSR1 to mpirun, or SIGTERM to the ranks; README "Stopping a run").
#pragma once

#include <string>

namespace tandem {

// Installs the handler of SIGTERM, SIGINT and SIGUSR1 (idempotent). Throws std::runtime_error when
// sigaction fails.
void install_exit_signal_handler();

// Whether one of them arrived since the handler was installed (or since clear_exit_signal).
bool exit_signal_received();

// The name of the first that arrived ("SIGTERM", "SIGINT", "SIGUSR1"), "" when none did.
std::string exit_signal_name();

// Forgets a received signal (tests that raise a signal more than once in one process).
void clear_exit_signal();

}  // namespace tandem
