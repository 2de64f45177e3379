// cuda-sim's execution engine (engine.hpp): a block's threads as Boost.Context fibers on the
// calling OS thread, resumed in the configured order until each waits at a barrier, waits at a
// warp collective or exits; then the collectives whose participants have all arrived complete and
// the engine goes round again. A block ends when every thread has exited.
//
// Rules checked as sm_90 would need them (docs/CUDA-SIM.md "Execution model"):
//   - __syncthreads: every thread that has not exited waits at the same call (file and line);
//     threads waiting at different ones are a fault naming both.
//   - a warp collective completes when every lane of its mask waits at the same call with the same
//     mask; a lane of the mask that exited, waits at a barrier or at another collective is a fault.
//   - a shuffle's source lane must be in the mask.
//   - blockDim within 1024 threads (x, y <= 1024, z <= 64), grid x < 2^31, y, z < 2^16.
#include "cuda_sim/engine.hpp"

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "cuda_sim/checks.hpp"
#include "cuda_sim/include/cuda_runtime.h"

#if defined(TANDEM_CUDA_SIM_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(TANDEM_CUDA_SIM_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

// The built-in variables of the thread the engine is running (a launch's blocks run one after
// another on an OS thread of the launch's own, so thread_local is the running block's).
thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace tandem::cuda_sim {
namespace {

namespace ctx = boost::context;

// A fiber's stack: 256 KiB, far above what the kernels' frames take (the sanitizer builds' frames
// are several times larger than -O2's).
constexpr std::size_t kStackBytes = 256 * 1024;
constexpr int kWarpSize = 32;

enum class State { runnable, at_barrier, at_collective, exited };

struct Waiting {
  const char* file = "";
  int line = 0;
};

struct Collective {
  ShuffleKind kind = ShuffleKind::xor_lane;
  unsigned int mask = 0;
  std::uint64_t bits = 0;
  int lane_argument = 0;
  int width = kWarpSize;
  std::uint64_t result = 0;
  const void* send = nullptr;  // exchange: this lane's bytes, and where every lane's go
  void* receive = nullptr;
  std::size_t bytes = 0;
};

// A stack, as AddressSanitizer is told of it at every switch (the sanitizer build: ASan cannot
// see a fiber switch by itself, and Debian's Boost.Context does not tell it).
struct StackRange {
  const void* bottom = nullptr;
  std::size_t size = 0;
};

void switch_begin([[maybe_unused]] void** fake_stack, [[maybe_unused]] StackRange to) {
#if defined(TANDEM_CUDA_SIM_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, to.bottom, to.size);
#endif
}

void switch_end([[maybe_unused]] void* fake_stack, [[maybe_unused]] StackRange* from) {
#if defined(TANDEM_CUDA_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, from == nullptr ? nullptr : &from->bottom,
                                  from == nullptr ? nullptr : &from->size);
#endif
}

// ThreadSanitizer's context of a fiber (the TSan build): TSan keeps a shadow stack and a clock per
// context and must be told of each switch, or every fiber's accesses look like the OS thread's
// with a stack that never unwinds. Switches pass flag 0: they synchronize, since a block's fibers
// do run one after another on one OS thread.
struct TsanFiber {
  void* context = nullptr;
#if defined(TANDEM_CUDA_SIM_TSAN)
  static TsanFiber create() { return TsanFiber{__tsan_create_fiber(0)}; }
  static TsanFiber running() { return TsanFiber{__tsan_get_current_fiber()}; }
  void switch_to() const { __tsan_switch_to_fiber(context, 0); }
  void destroy() {
    if (context != nullptr) __tsan_destroy_fiber(context);
    context = nullptr;
  }
#else
  static TsanFiber create() { return {}; }
  static TsanFiber running() { return {}; }
  void switch_to() const {}
  void destroy() {}
#endif
};

// Thrown at a waiting thread's suspension point when its block is abandoned after a fault: its
// stack unwinds as an exception's would, through the same annotated switches.
struct Abandon {};

struct SimThread {
  ctx::fiber fiber;   // the thread, while suspended
  ctx::fiber engine;  // the engine's continuation, while the thread runs
  StackRange stack;         // the fiber's
  StackRange engine_stack;  // the engine's OS thread's
  TsanFiber tsan;           // the fiber's ThreadSanitizer context, and the engine's
  TsanFiber tsan_engine;
  bool abandon = false;
  bool started = false;  // its runner has begun it (start_runner)
  uint3 index{};
  int linear = 0;
  State state = State::runnable;
  Waiting waiting;
  Collective collective;
  std::exception_ptr error;
};

// What the thread running now belongs to.
struct Current {
  SimThread* thread = nullptr;
  const LaunchSite* site = nullptr;
  uint3 block{};
};
thread_local Current current;

std::atomic<std::uint64_t> launches{0};

// The running block's dynamic shared memory (its launch's OS thread runs one block at a time).
struct SharedBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
};
thread_local SharedBuffer block_shared;

// The hazard checks' hooks (checks.hpp): set once, before any launch.
EngineChecks checks;

// The bytes a block's dynamic shared buffer takes: 16-byte aligned, and the checks' red zone.
std::size_t shared_allocation_bytes(std::size_t requested) {
  return requested == 0 ? 0 : (requested + 15) / 16 * 16 + kSharedRedZoneBytes;
}

struct FunctionLimits {
  std::mutex mutex;
  std::map<const void*, std::size_t> max_dynamic_shared;
};
FunctionLimits& function_limits() {
  static FunctionLimits limits;
  return limits;
}

// The thread order: chosen from the environment at the first launch, or by set_thread_order. Read
// and set under a mutex on the launching (host) thread only: a launch takes its order at the call
// (prepare_launch), so streams' workers never read it.
struct OrderState {
  std::mutex mutex;
  bool chosen = false;
  OrderSetting setting;
};
OrderState& order_state() {
  static OrderState state;
  return state;
}

std::string block_text(uint3 block) {
  std::ostringstream text;
  text << "(" << block.x << "," << block.y << "," << block.z << ")";
  return text.str();
}

std::string thread_text(const SimThread& thread) {
  std::ostringstream text;
  text << "(" << thread.index.x << "," << thread.index.y << "," << thread.index.z << ")";
  return text.str();
}

std::string where(const Waiting& waiting) { return std::string(waiting.file) + ":" + std::to_string(waiting.line); }

[[noreturn]] void fault(const LaunchSite& site, uint3 block, const std::string& what) {
  std::ostringstream text;
  text << "cuda-sim: kernel " << site.kernel << " (launched at " << site.file << ":" << site.line << "), block "
       << block_text(block) << ": " << what;
  throw KernelFault(text.str());
}

void check_configuration(const LaunchSite& site) {
  const Dim3 b = site.block, g = site.grid;
  const std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  std::string problem;
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) {
    problem = "a grid or block dimension is 0";
  } else if (threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    problem = "a block of " + std::to_string(b.x) + "x" + std::to_string(b.y) + "x" + std::to_string(b.z) +
              " threads: sm_90 allows 1024 in all (x, y <= 1024, z <= 64)";
  } else if (g.x > 0x7FFFFFFFu || g.y > 65535u || g.z > 65535u) {
    problem = "a grid of " + std::to_string(g.x) + "x" + std::to_string(g.y) + "x" + std::to_string(g.z) +
              " blocks: sm_90 allows x < 2^31, y and z < 2^16";
  }
  if (problem.empty() && site.dynamic_shared_bytes > max_dynamic_shared(site.function)) {
    throw InvalidLaunchArgument("cuda-sim: launch of " + std::string(site.kernel) + " at " + site.file + ":" +
                                std::to_string(site.line) + ": " + std::to_string(site.dynamic_shared_bytes) +
                                " bytes of dynamic shared memory, over the kernel's limit of " +
                                std::to_string(max_dynamic_shared(site.function)) +
                                " (raise it with cudaFuncSetAttribute(kernel, "
                                "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), at most " +
                                std::to_string(kMaxDynamicSharedBytes) + " on sm_90)");
  }
  if (!problem.empty()) {
    throw InvalidConfiguration("cuda-sim: launch of " + std::string(site.kernel) + " at " + site.file + ":" +
                               std::to_string(site.line) + ": invalid configuration: " + problem);
  }
}

// The order in which the engine resumes a block's threads.
std::vector<int> resume_order(int threads, OrderSetting setting, std::uint64_t launch_number, std::uint64_t block_number) {
  std::vector<int> order(static_cast<std::size_t>(threads));
  std::iota(order.begin(), order.end(), 0);
  if (setting.order == ThreadOrder::reverse) {
    std::reverse(order.begin(), order.end());
  } else if (setting.order == ThreadOrder::random) {
    std::seed_seq seeds{setting.seed, launch_number, block_number};
    std::mt19937_64 generator(seeds);
    std::shuffle(order.begin(), order.end(), generator);
  }
  return order;
}

// Suspends the running thread until the engine resumes it.
void suspend(SimThread& thread) {
  void* fake_stack = nullptr;
  switch_begin(&fake_stack, thread.engine_stack);
  thread.tsan_engine.switch_to();
  thread.engine = std::move(thread.engine).resume();
  switch_end(fake_stack, &thread.engine_stack);
  if (thread.abandon) throw Abandon{};
}

// Resumes a thread until it next waits or exits.
void resume(SimThread& thread) {
  void* fake_stack = nullptr;
  switch_begin(&fake_stack, thread.stack);
  thread.tsan.switch_to();
  thread.fiber = std::move(thread.fiber).resume();
  switch_end(fake_stack, nullptr);
}

// pooled_fixedsize_stack, recording each stack it hands out (ASan's switch annotations).
struct RecordingStacks {
  ctx::pooled_fixedsize_stack* pool;
  StackRange* record;
  ctx::stack_context allocate() {
    ctx::stack_context stack = pool->allocate();
    *record = StackRange{static_cast<char*>(stack.sp) - stack.size, stack.size};
    return stack;
  }
  void deallocate(ctx::stack_context& stack) noexcept { pool->deallocate(stack); }
};

unsigned int lane_of(const SimThread& thread) { return static_cast<unsigned int>(thread.linear % kWarpSize); }

// Whether two threads wait at the same call site (the pointers first: one file's __FILE__ is one
// string in practice, and the engine compares waits at every collective and barrier).
bool same_site(const Waiting& a, const Waiting& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// Whether two lanes wait at the same collective: the same call, mask, kind and size.
bool same_collective(const SimThread& a, const SimThread& b) {
  return same_site(a.waiting, b.waiting) && a.collective.mask == b.collective.mask &&
         a.collective.kind == b.collective.kind && a.collective.bytes == b.collective.bytes;
}

// Completes every warp collective whose lanes have all arrived; a fault where one cannot complete.
// Returns whether any thread became runnable.
bool complete_collectives(std::vector<SimThread>& threads, const LaunchSite& site, uint3 block) {
  bool progressed = false;
  const int count = static_cast<int>(threads.size());
  for (int warp_first = 0; warp_first < count; warp_first += kWarpSize) {
    const int warp_end = std::min(count, warp_first + kWarpSize);
    // The last lane whose whole mask was found waiting at its collective: a lane of that mask at
    // the same collective has the same mask, so its partners are already checked.
    const SimThread* checked = nullptr;
    for (int t = warp_first; t < warp_end; ++t) {
      SimThread& thread = threads[static_cast<std::size_t>(t)];
      if (thread.state != State::at_collective) continue;
      const unsigned int mask = thread.collective.mask;
      if ((mask >> lane_of(thread) & 1u) == 0) {
        fault(site, block, "thread " + thread_text(thread) + " calls a warp shuffle at " + where(thread.waiting) +
                               " with a mask that leaves out its own lane " + std::to_string(lane_of(thread)));
      }
      if (checked != nullptr && same_collective(thread, *checked)) continue;
      for (int lane = 0; lane < kWarpSize; ++lane) {
        if ((mask >> lane & 1u) == 0) continue;
        const int other_index = warp_first + lane;
        if (other_index >= warp_end) {
          fault(site, block, "thread " + thread_text(thread) + "'s warp shuffle at " + where(thread.waiting) +
                                 " names lane " + std::to_string(lane) + ", which the block does not have");
        }
        const SimThread& other = threads[static_cast<std::size_t>(other_index)];
        std::string problem;
        if (other.state == State::exited) {
          problem = "has exited";
        } else if (other.state == State::at_barrier) {
          problem = "waits at __syncthreads at " + where(other.waiting);
        } else if (!same_collective(other, thread)) {
          problem = "waits at another warp collective, at " + where(other.waiting);
        }
        if (!problem.empty()) {
          fault(site, block, "thread " + thread_text(thread) + "'s warp shuffle at " + where(thread.waiting) +
                                 " (mask 0x" + [&] { std::ostringstream h; h << std::hex << mask; return h.str(); }() +
                                 ") needs lane " + std::to_string(lane) + " (thread " + thread_text(other) + "), which " +
                                 problem);
        }
      }
      checked = &thread;
    }
    // Every waiting lane's partners have arrived: read the sources, then release.
    for (int t = warp_first; t < warp_end; ++t) {
      SimThread& thread = threads[static_cast<std::size_t>(t)];
      if (thread.state != State::at_collective) continue;
      const Collective& c = thread.collective;
      if (c.kind == ShuffleKind::exchange) {
        for (int lane = 0; lane < kWarpSize; ++lane) {
          if ((c.mask >> lane & 1u) == 0) continue;
          std::memcpy(static_cast<char*>(c.receive) + static_cast<std::size_t>(lane) * c.bytes,
                      threads[static_cast<std::size_t>(warp_first + lane)].collective.send, c.bytes);
        }
        continue;
      }
      const int lane = static_cast<int>(lane_of(thread));
      const int width = c.width;
      const int segment = (lane / width) * width;
      int source = lane;
      switch (c.kind) {
        case ShuffleKind::xor_lane: source = lane ^ c.lane_argument; break;
        case ShuffleKind::down: source = (lane % width) + c.lane_argument < width ? lane + c.lane_argument : lane; break;
        case ShuffleKind::up: source = (lane % width) - c.lane_argument >= 0 ? lane - c.lane_argument : lane; break;
        case ShuffleKind::index: source = segment + ((c.lane_argument % width) + width) % width; break;
        case ShuffleKind::exchange: break;  // handled above
      }
      if (source < 0 || source >= kWarpSize || (c.mask >> source & 1u) == 0) {
        fault(site, block, "thread " + thread_text(thread) + "'s warp shuffle at " + where(thread.waiting) +
                               " reads lane " + std::to_string(source) + ", outside its mask");
      }
      thread.collective.result = threads[static_cast<std::size_t>(warp_first + source)].collective.bits;
    }
    bool released = false;
    for (int t = warp_first; t < warp_end; ++t) {
      SimThread& thread = threads[static_cast<std::size_t>(t)];
      if (thread.state == State::at_collective) {
        thread.state = State::runnable;
        released = true;
      }
    }
    if (released && checks.warp_synchronized != nullptr) checks.warp_synchronized(warp_first / kWarpSize);
    progressed = progressed || released;
  }
  return progressed;
}

// Releases a barrier every live thread waits at; a fault when they wait at different ones.
bool release_barrier(std::vector<SimThread>& threads, const LaunchSite& site, uint3 block) {
  const SimThread* first = nullptr;
  for (const SimThread& thread : threads) {
    if (thread.state != State::at_barrier) continue;
    if (first == nullptr) {
      first = &thread;
    } else if (!same_site(thread.waiting, first->waiting)) {
      fault(site, block, "threads wait at different barriers: thread " + thread_text(*first) + " at __syncthreads at " +
                             where(first->waiting) + ", thread " + thread_text(thread) + " at " + where(thread.waiting));
    }
  }
  if (first == nullptr) return false;
  for (SimThread& thread : threads) {
    if (thread.state == State::at_barrier) thread.state = State::runnable;
  }
  if (checks.barrier_released != nullptr) checks.barrier_released();
  return true;
}

// The fibers that start a block's threads (run_block): each runs not-yet-started threads one after
// another, in the resume order, for as long as each runs to its end, so a kernel with no barrier
// and no warp collective runs a whole block on one fiber and one stack, never switching. A thread
// that waits keeps its runner's fiber as its own (the engine resumes it there), and the engine
// starts a new runner at the next thread: the threads run in exactly the order the engine would
// resume them if each had a fiber of its own.
struct Runners {
  std::vector<SimThread>& threads;
  const std::vector<int>& order;
  const std::function<void()>& thread_body;
  ctx::pooled_fixedsize_stack& stacks;
  std::size_t next = 0;          // the position in `order` of the next thread to start
  SimThread* running = nullptr;  // the thread the runner last switched to ran
  // Per runner (at most one a thread): its stack (ASan's switches) and its TSan context.
  std::vector<StackRange> runner_stacks = std::vector<StackRange>(threads.size());
  std::vector<TsanFiber> runner_contexts = std::vector<TsanFiber>(threads.size());
  std::size_t started_runners = 0;
  ~Runners() {
    for (TsanFiber& context : runner_contexts) context.destroy();
  }
};

// Starts a runner at the next unstarted thread and returns when the thread it runs waits, or when
// every thread it started has exited (or one failed): `runners.running` is the last it ran.
void start_runner(Runners& runners) {
  const std::size_t index = runners.started_runners++;
  StackRange* const stack = &runners.runner_stacks[index];
  runners.runner_contexts[index] = TsanFiber::create();
  const TsanFiber context = runners.runner_contexts[index];
  ctx::fiber runner(std::allocator_arg, RecordingStacks{&runners.stacks, stack},
                    [&runners, stack, context](ctx::fiber&& engine) {
                      StackRange engine_stack;
                      switch_end(nullptr, &engine_stack);
                      TsanFiber tsan_engine;
                      while (runners.next < runners.order.size()) {
                        SimThread& thread = runners.threads[static_cast<std::size_t>(runners.order[runners.next++])];
                        thread.started = true;
                        thread.stack = *stack;
                        thread.engine_stack = engine_stack;
                        thread.tsan = context;
                        thread.engine = std::move(engine);
                        runners.running = &thread;
                        current.thread = &thread;
                        threadIdx = thread.index;
                        try {
                          if (!thread.abandon) {  // a block abandoned before it started
                            runners.thread_body();
                            if (checks.thread_ends != nullptr) checks.thread_ends();
                          }
                        } catch (const Abandon&) {
                          // the block faulted elsewhere: this thread's stack has unwound
                        } catch (const ctx::detail::forced_unwind&) {
                          throw;  // Boost.Context unwinding a fiber it destroys
                        } catch (...) {
                          thread.error = std::current_exception();
                        }
                        thread.state = State::exited;
                        engine = std::move(thread.engine);  // the engine's latest continuation
                        engine_stack = thread.engine_stack;
                        tsan_engine = thread.tsan_engine;
                        if (thread.error || thread.abandon) break;
                      }
                      switch_begin(nullptr, engine_stack);
                      tsan_engine.switch_to();
                      return std::move(engine);
                    });
  void* fake_stack = nullptr;
  switch_begin(&fake_stack, *stack);
  context.switch_to();
  ctx::fiber back = std::move(runner).resume();
  switch_end(fake_stack, nullptr);
  runners.running->fiber = std::move(back);
}

void run_block(const LaunchSite& site, const std::function<void()>& thread_body, uint3 block, std::uint64_t launch_number,
               std::uint64_t block_number, OrderSetting setting, ctx::pooled_fixedsize_stack& stacks) {
  const Dim3 b = site.block;
  const int count = static_cast<int>(b.x * b.y * b.z);
  std::vector<SimThread> threads(static_cast<std::size_t>(count));
  for (int t = 0; t < count; ++t) {
    SimThread& thread = threads[static_cast<std::size_t>(t)];
    thread.linear = t;
    thread.index = uint3{static_cast<unsigned int>(t) % b.x, (static_cast<unsigned int>(t) / b.x) % b.y,
                         static_cast<unsigned int>(t) / (b.x * b.y)};
    thread.tsan_engine = TsanFiber::running();
  }
  const std::vector<int> order = resume_order(count, setting, launch_number, block_number);
  if (checks.block_begins != nullptr) checks.block_begins(block_shared.data, block_shared.bytes);
  // Declared after `threads`: destroyed first, the runners' TSan contexts end with the block (every
  // fiber has exited or unwound by then).
  Runners runners{threads, order, thread_body, stacks};
  current.site = &site;
  current.block = block;
  blockIdx = block;
  try {
    while (true) {
      for (const int t : order) {
        SimThread& thread = threads[static_cast<std::size_t>(t)];
        if (thread.state != State::runnable) continue;
        if (!thread.started) {
          start_runner(runners);
          current.thread = nullptr;
          if (runners.running->error) std::rethrow_exception(runners.running->error);
          continue;
        }
        current.thread = &thread;
        threadIdx = thread.index;
        resume(thread);
        current.thread = nullptr;
        if (thread.error) std::rethrow_exception(thread.error);
      }
      if (complete_collectives(threads, site, block)) continue;
      if (!release_barrier(threads, site, block)) break;
    }
  } catch (...) {
    // Unwind every thread still waiting, so none is destroyed suspended; those never started end.
    for (SimThread& thread : threads) {
      if (thread.state == State::exited) continue;
      if (!thread.started) {
        thread.state = State::exited;
        continue;
      }
      thread.abandon = true;
      current.thread = &thread;
      resume(thread);
      current.thread = nullptr;
    }
    throw;
  }
}

}  // namespace

OrderSetting order_from_environment() {
  const char* text = std::getenv("TANDEM_CUDA_SIM_ORDER");
  if (text == nullptr || *text == '\0') return {};
  const std::string value(text);
  if (value == "forward") return {ThreadOrder::forward, 0};
  if (value == "reverse") return {ThreadOrder::reverse, 0};
  if (value == "random") return {ThreadOrder::random, 1};
  if (value.rfind("random:", 0) == 0) {
    const std::string digits = value.substr(7);
    if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos && digits.size() <= 19) {
      return {ThreadOrder::random, std::stoull(digits)};
    }
  }
  throw std::invalid_argument("TANDEM_CUDA_SIM_ORDER=\"" + value +
                              "\": the order of a block's threads must be forward, reverse, random or random:SEED "
                              "(SEED a decimal integer); fix: one of those, or unset for forward");
}

void set_thread_order(OrderSetting setting) {
  OrderState& state = order_state();
  const std::lock_guard lock(state.mutex);
  state.setting = setting;
  state.chosen = true;
}

OrderSetting thread_order() {
  OrderState& state = order_state();
  const std::lock_guard lock(state.mutex);
  if (!state.chosen) {
    state.setting = order_from_environment();
    state.chosen = true;
  }
  return state.setting;
}

std::string describe(OrderSetting setting) {
  switch (setting.order) {
    case ThreadOrder::forward: return "forward";
    case ThreadOrder::reverse: return "reverse";
    case ThreadOrder::random: return "random:" + std::to_string(setting.seed);
  }
  return "?";
}

std::uint64_t launch_count() { return launches.load(std::memory_order_relaxed); }

bool in_kernel() { return current.thread != nullptr; }

PreparedLaunch prepare_launch(const LaunchSite& site) {
  check_configuration(site);
  if (in_kernel()) {
    throw KernelFault(std::string("cuda-sim: launch of ") + site.kernel + " at " + site.file + ":" +
                      std::to_string(site.line) + " from inside a kernel (dynamic parallelism is not simulated)");
  }
  // Relaxed: the number only names the launch; a stronger order would make every launch on one
  // stream's worker happen-before the next launch on another's, hiding a race from ThreadSanitizer.
  return PreparedLaunch{site, thread_order(), launches.fetch_add(1, std::memory_order_relaxed)};
}

void launch(const LaunchSite& site, const std::function<void()>& thread_body) {
  run_prepared(prepare_launch(site), thread_body);
}

void run_prepared(const PreparedLaunch& prepared, const std::function<void()>& thread_body) {
  const LaunchSite& site = prepared.site;
  const OrderSetting setting = prepared.order;
  const std::uint64_t launch_number = prepared.number;
  // The launching thread's fiber stacks, kept from launch to launch (a stack's pages, once touched,
  // stay mapped: a fresh pool per launch paid a page fault for every first touch). Named through a
  // reference: in the launch's thread below, `launching_stacks` would be that thread's own.
  static thread_local ctx::pooled_fixedsize_stack launching_stacks(kStackBytes);
  ctx::pooled_fixedsize_stack& stacks = launching_stacks;
  const Dim3 g = site.grid;
  // A launch's blocks run one after another on an OS thread of the launch's own: a static
  // __shared__ variable (thread_local) starts zeroed at the launch's first block, and each later
  // block finds what the block before it left (CUDA leaves it undefined; a device's SM keeps the
  // bytes of the block it ran before). One thread a launch, not a block: creating a thread and its
  // TLS costs more than most blocks do.
  std::exception_ptr error;
  std::thread launch_thread([&] {
    try {
      std::uint64_t block_number = 0;
      for (unsigned int z = 0; z < g.z; ++z) {
        for (unsigned int y = 0; y < g.y; ++y) {
          for (unsigned int x = 0; x < g.x; ++x) {
            // 16-byte aligned as extern __shared__ __align__(16) asks; 0xFF bytes (undefined on a device).
            const std::size_t rounded = shared_allocation_bytes(site.dynamic_shared_bytes);
            std::unique_ptr<void, decltype(&std::free)> shared(
                rounded == 0 ? nullptr : std::aligned_alloc(16, rounded), &std::free);
            if (rounded != 0 && shared == nullptr) throw std::bad_alloc();
            if (rounded != 0) std::memset(shared.get(), 0xFF, rounded);
            block_shared = SharedBuffer{shared.get(), site.dynamic_shared_bytes};
            blockDim = dim3(site.block.x, site.block.y, site.block.z);
            gridDim = dim3(g.x, g.y, g.z);
            run_block(site, thread_body, uint3{x, y, z}, launch_number, block_number, setting, stacks);
            block_shared = SharedBuffer{};
            ++block_number;
          }
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    current = Current{};
    block_shared = SharedBuffer{};
  });
  launch_thread.join();
  if (error) std::rethrow_exception(error);
}

void sync_threads(const char* file, int line) {
  SimThread* thread = current.thread;
  if (thread == nullptr) throw std::logic_error("cuda-sim: __syncthreads outside a kernel");
  thread->state = State::at_barrier;
  thread->waiting = Waiting{file, line};
  suspend(*thread);
}

std::uint64_t shuffle(ShuffleKind kind, unsigned int mask, std::uint64_t bits, int lane_argument, int width,
                      const char* file, int line) {
  SimThread* thread = current.thread;
  if (thread == nullptr) throw std::logic_error("cuda-sim: a warp shuffle outside a kernel");
  if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0) {
    fault(*current.site, current.block,
          "thread " + thread_text(*thread) + "'s warp shuffle at " + file + ":" + std::to_string(line) + " has width " +
              std::to_string(width) + ": a power of two from 1 to 32");
  }
  thread->state = State::at_collective;
  thread->waiting = Waiting{file, line};
  thread->collective = Collective{kind, mask, bits, lane_argument, width, 0};
  suspend(*thread);
  return thread->collective.result;
}

}  // namespace tandem::cuda_sim

namespace tandem::cuda_sim {

void warp_exchange(unsigned int mask, const void* send, void* receive, std::size_t bytes, const char* file, int line) {
  SimThread* thread = current.thread;
  if (thread == nullptr) throw std::logic_error("cuda-sim: a warp collective outside a kernel");
  thread->state = State::at_collective;
  thread->waiting = Waiting{file, line};
  thread->collective = Collective{ShuffleKind::exchange, mask, 0, 0, kWarpSize, 0, send, receive, bytes};
  suspend(*thread);
}

void* dynamic_shared() {
  if (current.thread == nullptr) throw std::logic_error("cuda-sim: dynamic shared memory outside a kernel");
  return block_shared.data;
}

std::size_t dynamic_shared_bytes() { return block_shared.bytes; }

int thread_lane() {
  if (current.thread == nullptr) throw std::logic_error("cuda-sim: a lane outside a kernel");
  return static_cast<int>(lane_of(*current.thread));
}

bool set_max_dynamic_shared(const void* function, std::size_t bytes) {
  if (bytes > kMaxDynamicSharedBytes) return false;
  FunctionLimits& limits = function_limits();
  const std::lock_guard lock(limits.mutex);
  limits.max_dynamic_shared[function] = bytes;
  return true;
}

std::size_t max_dynamic_shared(const void* function) {
  FunctionLimits& limits = function_limits();
  const std::lock_guard lock(limits.mutex);
  const auto found = limits.max_dynamic_shared.find(function);
  return found == limits.max_dynamic_shared.end() ? kDefaultDynamicSharedBytes : found->second;
}

void thread_fault(const std::string& what) {
  if (current.thread == nullptr) throw std::logic_error("cuda-sim: " + what);
  throw KernelFault(running_thread_text() + " " + what);
}

std::string running_thread_text() {
  if (current.thread == nullptr) throw std::logic_error("cuda-sim: a thread's coordinates outside a kernel");
  std::ostringstream text;
  text << "cuda-sim: kernel " << current.site->kernel << " (launched at " << current.site->file << ":"
       << current.site->line << "), block " << block_text(current.block) << ": thread " << thread_text(*current.thread);
  return text.str();
}

int thread_rank() {
  if (current.thread == nullptr) throw std::logic_error("cuda-sim: a thread's rank outside a kernel");
  return current.thread->linear;
}

void install_checks(const EngineChecks& installed) { checks = installed; }

}  // namespace tandem::cuda_sim
