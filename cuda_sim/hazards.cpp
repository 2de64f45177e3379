// cuda-sim's hazard checks (docs/CUDA-SIM.md "Hazard checks"), as compute-sanitizer's racecheck,
// initcheck and memcheck find them, for kernel units compiled with GCC's ThreadSanitizer
// instrumentation and linked WITHOUT its runtime: this file is that runtime. Every load and store
// the instrumented code makes calls __tsan_readN / __tsan_writeN with its address; inside a kernel
// (engine.hpp in_kernel) the access is checked against
//   - device memory (memcheck, initcheck): cudaMalloc hands out memory from one reserved arena,
//     each allocation with red zones around it and never reused after cudaFree (its pages given
//     back); a shadow byte per byte says unaddressable, allocated but never written, or written;
//   - shared memory (racecheck): the block's dynamic shared buffer (memcheck past its end too) and
//     its static __shared__ variables, which are the executable's thread-locals (the static TLS
//     block of the block's OS thread). Per byte, the last writer and the last two readers of the
//     current barrier interval: an access by another thread in the same interval, when one of
//     them is a write, is a hazard, unless both threads are lanes of one warp and a warp
//     collective of that warp completed between them.
// A check cannot throw where the access is (GCC declares these entry points nothrow): the first
// hazard of a block is kept, and thrown as a KernelFault when one of its threads ends.
#include "cuda_sim/hazards.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include "cuda_sim/checks.hpp"
#include "cuda_sim/engine.hpp"
#include "cuda_sim/include/cuda_runtime.h"

namespace tandem::cuda_sim {
namespace {

// ---- Device memory ------------------------------------------------------------------------

// Address space only: pages are touched where an allocation is, and given back when it is freed.
constexpr std::size_t kArenaBytes = std::size_t{1} << 40;
constexpr std::size_t kAlignment = 256;  // cudaMalloc's
constexpr std::size_t kRedZoneBytes = 256;

enum Shadow : std::uint8_t { kUnaddressable = 0, kUnwritten = 1, kWritten = 2 };

struct Allocation {
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
  bool freed = false;
};

struct Arena {
  std::uintptr_t begin = 0;
  std::uint8_t* shadow = nullptr;  // [kArenaBytes], one Shadow per byte
  std::mutex mutex;
  std::size_t next = kRedZoneBytes;  // offset of the next allocation
  std::map<std::uintptr_t, Allocation> allocations;  // by begin: live and freed (never reused)
};
Arena* arena = nullptr;  // set by install(), before main

std::uint8_t shadow_load(std::size_t offset) { return __atomic_load_n(&arena->shadow[offset], __ATOMIC_RELAXED); }
void shadow_store(std::size_t offset, std::uint8_t value) {
  __atomic_store_n(&arena->shadow[offset], value, __ATOMIC_RELAXED);
}

bool in_arena(std::uintptr_t address) { return address - arena->begin < kArenaBytes; }

void* allocate(std::size_t bytes) {
  const std::size_t rounded = std::max<std::size_t>(1, (bytes + kAlignment - 1) / kAlignment) * kAlignment;
  const std::lock_guard lock(arena->mutex);
  const std::size_t offset = arena->next;
  if (offset + rounded + kRedZoneBytes > kArenaBytes) return nullptr;
  arena->next = offset + rounded + kRedZoneBytes;
  auto* memory = reinterpret_cast<char*>(arena->begin + offset);
  std::memset(memory, 0xFF, rounded);
  std::memset(arena->shadow + offset, kUnwritten, bytes);  // the rounding's tail stays unaddressable
  arena->allocations[arena->begin + offset] = Allocation{arena->begin + offset, bytes, false};
  return memory;
}

// The whole pages inside [begin, begin + bytes), given back to the system (they read as zeros).
void give_back_pages(void* begin, std::size_t bytes) {
  const std::uintptr_t page = 4096;
  const std::uintptr_t first = (reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page;
  const std::uintptr_t last = (reinterpret_cast<std::uintptr_t>(begin) + bytes) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void release(void* memory) {
  const std::lock_guard lock(arena->mutex);
  const auto found = arena->allocations.find(reinterpret_cast<std::uintptr_t>(memory));
  if (found == arena->allocations.end() || found->second.freed) return;  // the runtime checked it
  Allocation& allocation = found->second;
  allocation.freed = true;
  const std::size_t offset = allocation.begin - arena->begin;
  std::memset(arena->shadow + offset, kUnaddressable, allocation.bytes);
  give_back_pages(memory, allocation.bytes);
  give_back_pages(arena->shadow + offset, allocation.bytes);
}

void written(void* destination, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(destination);
  if (!in_arena(address)) return;
  const std::size_t offset = address - arena->begin;
  for (std::size_t i = 0; i < bytes && offset + i < kArenaBytes; ++i) {
    if (shadow_load(offset + i) == kUnwritten) shadow_store(offset + i, kWritten);
  }
}

// A device-to-device copy carries the source's written bytes, and its unwritten ones, along.
void copied(void* destination, const void* source, std::size_t bytes) {
  const auto to = reinterpret_cast<std::uintptr_t>(destination);
  const auto from = reinterpret_cast<std::uintptr_t>(source);
  if (!in_arena(to)) return;
  if (!in_arena(from)) {
    written(destination, bytes);
    return;
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    const std::size_t to_offset = to - arena->begin + i, from_offset = from - arena->begin + i;
    if (shadow_load(to_offset) == kUnaddressable) continue;
    shadow_store(to_offset, shadow_load(from_offset) == kWritten ? kWritten : kUnwritten);
  }
}

// Which allocation an arena address is in or nearest to, in words.
std::string describe_device_address(std::uintptr_t address) {
  const std::lock_guard lock(arena->mutex);
  std::ostringstream text;
  if (arena->allocations.empty()) return "no allocation made yet";
  auto after = arena->allocations.upper_bound(address);
  if (after == arena->allocations.begin()) {
    text << std::dec << (after->second.begin - address) << " bytes before the allocation of " << after->second.bytes
         << " bytes at 0x" << std::hex << after->second.begin;
    return text.str();
  }
  const Allocation& below = std::prev(after)->second;
  const std::size_t offset = address - below.begin;
  if (below.freed) {
    text << "byte " << offset << " of a freed allocation (cudaFree) of " << below.bytes << " bytes at 0x" << std::hex
         << below.begin;
  } else if (offset < below.bytes) {
    text << "byte " << offset << " of the allocation of " << below.bytes << " bytes at 0x" << std::hex << below.begin;
  } else if (after == arena->allocations.end() || offset - below.bytes <= after->second.begin - address) {
    text << (offset - below.bytes) << " bytes past the end of the allocation of " << below.bytes << " bytes at 0x"
         << std::hex << below.begin;
  } else {
    text << (after->second.begin - address) << " bytes before the allocation of " << after->second.bytes
         << " bytes at 0x" << std::hex << after->second.begin;
  }
  return text.str();
}

// ---- The running block -----------------------------------------------------------------------

constexpr int kWarpSize = 32;
constexpr int kMaxWarps = 1024 / kWarpSize;

// One byte of shared memory: who accessed it in the current barrier interval.
struct Cell {
  std::uint64_t block = 0;     // BlockState::serial of the block these are of (another's are stale)
  std::uint32_t interval = 0;  // barrier interval of the accesses below
  std::int16_t writer = -1;    // the last writer's rank, its warp's collective count then
  std::uint32_t writer_sync = 0;
  std::int16_t readers[2] = {-1, -1};  // the last two distinct readers, newest first
  std::uint32_t reader_syncs[2] = {0, 0};
  bool readers_of_several_warps = false;
};

struct CellsFree {
  void operator()(Cell* cells) const { std::free(cells); }
};
using Cells = std::unique_ptr<Cell[], CellsFree>;

// calloc's zeros are cells of no block (BlockState::serial starts at 1), reset at their first
// access: a large array costs only the pages it touches.
Cells allocate_cells(std::size_t count) {
  static_assert(std::is_trivially_copyable_v<Cell>);
  auto* memory = static_cast<Cell*>(std::calloc(count, sizeof(Cell)));
  if (memory == nullptr && count != 0) throw std::bad_alloc();
  return Cells(memory);
}

enum class Region { dynamic_shared, static_shared };

struct Hazard {
  std::string text;
  std::uintptr_t pc = 0;
};

struct BlockState {
  std::uint64_t serial = 0;  // blocks begun on this OS thread
  std::uintptr_t shared_begin = 0;
  std::size_t shared_bytes = 0;  // the launch's; kSharedRedZoneBytes more are allocated (engine.hpp)
  std::size_t shared_span = 0;   // with the rounding and the red zone
  Cells shared_cells;
  std::size_t shared_capacity = 0;
  bool tls_known = false;
  std::uintptr_t tls_begin = 0;  // this OS thread's static TLS block of the executable
  std::size_t tls_bytes = 0;
  Cells tls_cells;
  std::uint32_t interval = 0;  // barriers released in this block
  std::array<std::uint32_t, kMaxWarps> warp_syncs{};
  std::optional<Hazard> first;
};
thread_local BlockState block;

// The executable's PT_TLS segment (its size and alignment), the first module dl_iterate_phdr names.
struct TlsSegment {
  std::size_t bytes = 0;
  std::size_t align = 1;
};
TlsSegment executable_tls() {
  TlsSegment segment;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* found = static_cast<TlsSegment*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) {
            found->bytes = info->dlpi_phdr[i].p_memsz;
            found->align = std::max<std::size_t>(1, info->dlpi_phdr[i].p_align);
          }
        }
        return 1;  // the executable only
      },
      &segment);
  return segment;
}

// x86-64's TLS layout (variant II): the executable's block ends at the thread pointer. Checked
// against a thread-local the executable holds (threadIdx): where it is not inside, static shared
// memory is not checked, and static_shared_checked() says so.
void find_static_tls(BlockState& state) {
  state.tls_known = true;
  const TlsSegment segment = executable_tls();
  const auto thread_pointer = reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
  const std::size_t bytes = (segment.bytes + segment.align - 1) / segment.align * segment.align;
  const auto probe = reinterpret_cast<std::uintptr_t>(&threadIdx);
  if (bytes == 0 || probe < thread_pointer - bytes || probe >= thread_pointer) return;
  state.tls_begin = thread_pointer - bytes;
  state.tls_bytes = bytes;
  state.tls_cells = allocate_cells(bytes);
}

void block_begins(void* dynamic_shared, std::size_t bytes) {
  BlockState& state = block;
  ++state.serial;
  state.interval = 0;
  state.warp_syncs.fill(0);
  state.first.reset();
  state.shared_begin = reinterpret_cast<std::uintptr_t>(dynamic_shared);
  state.shared_bytes = bytes;
  state.shared_span = bytes == 0 ? 0 : (bytes + 15) / 16 * 16 + kSharedRedZoneBytes;
  if (state.shared_span > state.shared_capacity) {
    state.shared_cells = allocate_cells(state.shared_span);
    state.shared_capacity = state.shared_span;
  }
  if (!state.tls_known) find_static_tls(state);
}

void barrier_released() { ++block.interval; }
void warp_synchronized(int warp) { ++block.warp_syncs[static_cast<std::size_t>(warp)]; }

std::string rank_text(int rank) {
  const unsigned int r = static_cast<unsigned int>(rank);
  std::ostringstream text;
  text << "(" << r % blockDim.x << "," << (r / blockDim.x) % blockDim.y << "," << r / (blockDim.x * blockDim.y) << ")";
  return text.str();
}

const char* kind_text(bool write) { return write ? "write" : "read"; }

void record(const std::string& check, const std::string& what, std::uintptr_t pc) {
  BlockState& state = block;
  if (state.first) return;
  state.first = Hazard{running_thread_text() + " " + check + ": " + what, pc};
}

std::string access_text(bool write, std::size_t size, std::uintptr_t address) {
  std::ostringstream text;
  text << kind_text(write) << " of " << size << " bytes at 0x" << std::hex << address;
  return text.str();
}

void device_access(std::uintptr_t address, std::size_t size, bool write, std::uintptr_t pc) {
  const std::size_t offset = address - arena->begin;
  for (std::size_t i = 0; i < size; ++i) {
    const std::uint8_t shadow = shadow_load(offset + i);
    if (shadow == kUnaddressable) {
      record("memcheck", access_text(write, size, address) + ", outside every live allocation: " +
                             describe_device_address(address + i),
             pc);
      return;
    }
    if (shadow == kUnwritten && !write) {
      record("initcheck", access_text(write, size, address) + " reads device memory never written (" +
                              describe_device_address(address + i) + ")",
             pc);
      return;
    }
  }
  if (write) {
    for (std::size_t i = 0; i < size; ++i) {
      if (shadow_load(offset + i) == kUnwritten) shadow_store(offset + i, kWritten);
    }
  }
}

// Whether the access of `other` (a rank, its warp's collective count then) is ordered before the
// running thread's: the same thread, or a lane of its warp with a warp collective between.
bool ordered(int other, std::uint32_t other_sync, int rank, std::uint32_t sync) {
  return other == rank || (other / kWarpSize == rank / kWarpSize && other_sync != sync);
}

void shared_access(Region region, Cell* cells, std::size_t offset, std::uintptr_t address, std::size_t size, bool write,
                   std::uintptr_t pc) {
  BlockState& state = block;
  const int rank = thread_rank();
  const int warp = rank / kWarpSize;
  const std::uint32_t sync = state.warp_syncs[static_cast<std::size_t>(warp)];
  const auto where = [&](std::size_t byte) {
    std::ostringstream text;
    if (region == Region::dynamic_shared) {
      text << "dynamic shared memory, byte " << offset + byte << " of " << state.shared_bytes;
    } else {
      text << "static __shared__ memory";
    }
    return text.str();
  };
  const auto hazard = [&](std::size_t byte, const char* earlier, int other) {
    record("racecheck", access_text(write, size, address) + " (" + where(byte) + ") after thread " + rank_text(other) +
                            "'s " + earlier + " with no __syncthreads between them",
           pc);
  };
  for (std::size_t i = 0; i < size; ++i) {
    if (region == Region::dynamic_shared && offset + i >= state.shared_bytes) {
      record("memcheck", access_text(write, size, address) + " past the end of the block's " +
                             std::to_string(state.shared_bytes) + " bytes of dynamic shared memory (byte " +
                             std::to_string(offset + i) + ")",
             pc);
      return;
    }
    Cell& cell = cells[offset + i];
    if (cell.block != state.serial || cell.interval != state.interval) {
      cell = Cell{};
      cell.block = state.serial;
      cell.interval = state.interval;
    }
    if (cell.writer >= 0 && !ordered(cell.writer, cell.writer_sync, rank, sync)) {
      hazard(i, "write", cell.writer);
      return;
    }
    if (write) {
      for (int r = 0; r < 2; ++r) {
        const int reader = cell.readers[r];
        if (reader >= 0 && !ordered(reader, cell.reader_syncs[r], rank, sync)) {
          hazard(i, "read", reader);
          return;
        }
      }
      if (cell.readers_of_several_warps) {  // some reader is of another warp than this one
        hazard(i, "read", cell.readers[0] / kWarpSize != warp ? cell.readers[0] : cell.readers[1]);
        return;
      }
      cell.writer = static_cast<std::int16_t>(rank);
      cell.writer_sync = sync;
    } else if (cell.readers[0] == rank) {
      cell.reader_syncs[0] = sync;
    } else {
      if (cell.readers[0] >= 0 && cell.readers[0] / kWarpSize != warp) cell.readers_of_several_warps = true;
      cell.readers[1] = cell.readers[0];
      cell.reader_syncs[1] = cell.reader_syncs[0];
      cell.readers[0] = static_cast<std::int16_t>(rank);
      cell.reader_syncs[0] = sync;
    }
  }
}

void check_access(const volatile void* pointer, std::size_t size, bool write, void* return_address) {
  if (!in_kernel()) return;
  BlockState& state = block;
  if (state.first) return;  // one report per block
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  const auto pc = reinterpret_cast<std::uintptr_t>(return_address);
  if (in_arena(address)) {
    device_access(address, size, write, pc);
  } else if (address - state.shared_begin < state.shared_span) {
    shared_access(Region::dynamic_shared, state.shared_cells.get(), address - state.shared_begin, address, size, write,
                  pc);
  } else if (address - state.tls_begin < state.tls_bytes) {
    // An access running past the block's end is the next thread-local's: checked up to the end.
    const std::size_t offset = address - state.tls_begin;
    shared_access(Region::static_shared, state.tls_cells.get(), offset, address,
                  std::min(size, state.tls_bytes - offset), write, pc);
  }
}

// "file:line in function", innermost first, each inlined frame after it, from addr2line; the
// bare address where addr2line is missing or knows nothing.
std::string source_line(std::uintptr_t pc) {
  std::ostringstream fallback;
  fallback << "pc 0x" << std::hex << pc;
  Dl_info info{};
  link_map* module = nullptr;
  if (dladdr1(reinterpret_cast<void*>(pc), &info, reinterpret_cast<void**>(&module), RTLD_DL_LINKMAP) == 0 ||
      module == nullptr || info.dli_fname == nullptr) {
    return fallback.str();
  }
  // The return address is the instruction after the call: step back into the call.
  std::ostringstream command;
  // The executable as this process's /proc entry names it (addr2line's own /proc/self is its own).
  const std::string executable = "/proc/" + std::to_string(getpid()) + "/exe";
  command << "addr2line -f -i -C -e '" << (module->l_name[0] == '\0' ? executable.c_str() : module->l_name) << "' 0x"
          << std::hex << (pc - 1 - module->l_addr) << " 2>/dev/null";
  FILE* pipe = popen(command.str().c_str(), "r");
  if (pipe == nullptr) return fallback.str();
  std::string output;
  std::array<char, 512> chunk{};
  while (std::fgets(chunk.data(), static_cast<int>(chunk.size()), pipe) != nullptr) output += chunk.data();
  if (pclose(pipe) != 0 || output.empty() || output.rfind("??", 0) == 0) return fallback.str();
  std::istringstream lines(output);
  std::string function, location, text;
  bool innermost = true;
  while (std::getline(lines, function) && std::getline(lines, location)) {
    const std::size_t discriminator = location.find(" (discriminator");
    if (discriminator != std::string::npos) location.resize(discriminator);
    text += (innermost ? "" : ", inlined into ") + location + " in " + function;
    innermost = false;
  }
  return text.empty() ? fallback.str() : text;
}

void thread_ends() {
  BlockState& state = block;
  if (!state.first) return;
  const Hazard hazard = *state.first;
  throw KernelFault(hazard.text + ", at " + source_line(hazard.pc));
}

bool install() {
  void* data = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* shadow = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED || shadow == MAP_FAILED) {
    std::fputs("cuda-sim hazard checks: cannot reserve the device memory arena (mmap of 2 TiB of address space, "
               "MAP_NORESERVE); fix: allow overcommit (vm.overcommit_memory 0 or 1) and an address space limit "
               "(ulimit -v) of unlimited\n",
               stderr);
    std::abort();
  }
  arena = new Arena;
  arena->begin = reinterpret_cast<std::uintptr_t>(data);
  arena->shadow = static_cast<std::uint8_t*>(shadow);
  install_device_memory_checks(DeviceMemoryChecks{allocate, release, written, copied});
  EngineChecks engine;
  engine.block_begins = block_begins;
  engine.barrier_released = barrier_released;
  engine.warp_synchronized = warp_synchronized;
  engine.thread_ends = thread_ends;
  install_checks(engine);
  return true;
}
const bool installed = install();

}  // namespace

bool static_shared_checked() {
  if (!block.tls_known) find_static_tls(block);
  return block.tls_bytes != 0 && installed;
}

}  // namespace tandem::cuda_sim

// ThreadSanitizer's entry points, as GCC's -fsanitize=thread calls them.
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* address, unsigned long size) {
  tandem::cuda_sim::check_access(address, size, false, __builtin_return_address(0));
}
void __tsan_write_range(void* address, unsigned long size) {
  tandem::cuda_sim::check_access(address, size, true, __builtin_return_address(0));
}
#define TANDEM_TSAN_ACCESS(size)                                                             \
  void __tsan_read##size(void* address) {                                                    \
    tandem::cuda_sim::check_access(address, size, false, __builtin_return_address(0));       \
  }                                                                                          \
  void __tsan_write##size(void* address) {                                                   \
    tandem::cuda_sim::check_access(address, size, true, __builtin_return_address(0));        \
  }                                                                                          \
  void __tsan_unaligned_read##size(void* address) {                                          \
    tandem::cuda_sim::check_access(address, size, false, __builtin_return_address(0));       \
  }                                                                                          \
  void __tsan_unaligned_write##size(void* address) {                                         \
    tandem::cuda_sim::check_access(address, size, true, __builtin_return_address(0));        \
  }                                                                                          \
  void __tsan_volatile_read##size(void* address) {                                           \
    tandem::cuda_sim::check_access(address, size, false, __builtin_return_address(0));       \
  }                                                                                          \
  void __tsan_volatile_write##size(void* address) {                                          \
    tandem::cuda_sim::check_access(address, size, true, __builtin_return_address(0));        \
  }
TANDEM_TSAN_ACCESS(1)
TANDEM_TSAN_ACCESS(2)
TANDEM_TSAN_ACCESS(4)
TANDEM_TSAN_ACCESS(8)
TANDEM_TSAN_ACCESS(16)
#undef TANDEM_TSAN_ACCESS
}
