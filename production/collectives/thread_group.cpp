// Ranks as threads of one process (thread_group.hpp).
#include "production/collectives/thread_group.hpp"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <utility>
#include <stdexcept>
#include <thread>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

// What the ranks of one group share: a reusable barrier that can be abandoned, and each rank's
// published pointer for the exchange in progress.
struct Shared {
  explicit Shared(int size) : size(size), published(static_cast<std::size_t>(size), nullptr) {}

  // Waits until every rank arrives; throws once the group is abandoned.
  void arrive_and_wait() {
    std::unique_lock lock(mutex);
    if (abandoned) throw std::runtime_error("thread group abandoned: another rank failed");
    const std::uint64_t generation_now = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return;
    }
    changed.wait(lock, [&] { return generation != generation_now || abandoned; });
    if (abandoned) throw std::runtime_error("thread group abandoned: another rank failed");
  }
  void abandon() {
    std::lock_guard lock(mutex);
    abandoned = true;
    changed.notify_all();
  }
  // Point to point: a send copies its bytes into the pair's mailbox and returns; a receive waits
  // for the pair's oldest message (throws once the group is abandoned).
  void post(int from, int to, const void* bytes, std::int64_t count) {
    std::vector<std::uint8_t> message(static_cast<std::size_t>(count));
    if (count > 0) std::memcpy(message.data(), bytes, static_cast<std::size_t>(count));
    std::lock_guard lock(mutex);
    if (abandoned) throw std::runtime_error("thread group abandoned: another rank failed");
    mailboxes[{from, to}].push_back(std::move(message));
    changed.notify_all();
  }
  void take(int from, int to, void* bytes, std::int64_t count) {
    std::unique_lock lock(mutex);
    auto& mailbox = mailboxes[{from, to}];
    changed.wait(lock, [&] { return !mailbox.empty() || abandoned; });
    if (abandoned) throw std::runtime_error("thread group abandoned: another rank failed");
    const std::vector<std::uint8_t> message = std::move(mailbox.front());
    mailbox.pop_front();
    lock.unlock();
    if (static_cast<std::int64_t>(message.size()) != count) {
      throw std::runtime_error("exchange_with_peers: rank " + std::to_string(from) + " sent " +
                               std::to_string(message.size()) + " bytes where " + std::to_string(count) +
                               " were expected");
    }
    if (count > 0) std::memcpy(bytes, message.data(), static_cast<std::size_t>(count));
  }

  const int size;
  std::vector<const void*> published;  // [size] this exchange's pointer of each rank
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  std::uint64_t generation = 0;
  bool abandoned = false;
  std::map<std::pair<int, int>, std::deque<std::vector<std::uint8_t>>> mailboxes;  // (from, to): messages in order
};

class ThreadRank final : public Collectives {
 public:
  ThreadRank(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  std::string description() const override {
    return "threads of one process, " + std::to_string(shared_->size) + " ranks";
  }
  // Each exchange: publish a pointer, wait for all, copy from the others, wait again (so no rank
  // reuses its memory while another still reads it).
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    exchange(sent, [&](int from, const void* theirs) {
      if (count == 0) return;
      std::memcpy(received + from * count, theirs, static_cast<std::size_t>(count) * sizeof(double));
    });
  }
  // Each rank publishes what it sends; the rank it sends to copies it (the pairs fit).
  void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) override {
    (void)to;
    exchange(sent, [&](int rank, const void* theirs) {
      if (rank != from || count == 0) return;
      std::memcpy(received, theirs, static_cast<std::size_t>(count) * sizeof(Real));
    });
  }
  void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) override {
    exchange(buffer, [&](int from, const void* theirs) {
      if (from == rank_ || chunk_bytes == 0) return;
      std::memcpy(static_cast<char*>(buffer) + from * chunk_bytes,
                  static_cast<const char*>(theirs) + from * chunk_bytes,
                  static_cast<std::size_t>(chunk_bytes));
    });
  }
  void exchange_with_peers(const PeerExchange& exchange) override {
    for (const PeerSend& send : exchange.sends) check_peer(send.to);
    for (const PeerReceive& receive : exchange.receives) check_peer(receive.from);
    // Posted at once (a mailbox keeps any number), so the receives below wait for nothing of ours.
    for (const PeerSend& send : exchange.sends) shared_->post(rank_, send.to, send.data, send.bytes);
    for (const PeerReceive& receive : exchange.receives) shared_->take(receive.from, rank_, receive.data, receive.bytes);
  }
  void barrier() override { shared_->arrive_and_wait(); }

  void abandon() { shared_->abandon(); }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= shared_->size || peer == rank_) {
      throw std::invalid_argument("exchange_with_peers: rank " + std::to_string(rank_) + " of " +
                                  std::to_string(shared_->size) + " named peer " + std::to_string(peer));
    }
  }
  // (memcpy of zero bytes may still not take a null pointer: exchanges of nothing skip it.)
  template <class Copy>
  void exchange(const void* mine, Copy&& copy) {
    shared_->published[static_cast<std::size_t>(rank_)] = mine;
    shared_->arrive_and_wait();
    for (int from = 0; from < shared_->size; ++from) copy(from, shared_->published[static_cast<std::size_t>(from)]);
    shared_->arrive_and_wait();
  }

  std::shared_ptr<Shared> shared_;
  int rank_ = 0;
};

}  // namespace

std::vector<std::shared_ptr<Collectives>> make_thread_group(int size) {
  if (size < 1) throw std::invalid_argument("make_thread_group: size must be >= 1, got " + std::to_string(size));
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::shared_ptr<Collectives>> group;
  for (int rank = 0; rank < size; ++rank) group.push_back(std::make_shared<ThreadRank>(shared, rank));
  return group;
}

void abandon_thread_groups(const std::vector<std::shared_ptr<Collectives>>& members) {
  for (const auto& member : members) {
    if (auto* rank = dynamic_cast<ThreadRank*>(member.get())) rank->abandon();
  }
}

void run_thread_group(const std::vector<std::shared_ptr<Collectives>>& group,
                      const std::function<void(int rank)>& body) {
  std::vector<std::exception_ptr> failures(group.size());
  std::vector<std::thread> threads;
  for (std::size_t rank = 0; rank < group.size(); ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(static_cast<int>(rank));
      } catch (...) {
        failures[rank] = std::current_exception();
        if (auto* member = dynamic_cast<ThreadRank*>(group[rank].get())) member->abandon();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // The first failure that is not the abandonment's echo, else the first of any.
  std::exception_ptr first;
  for (const auto& failure : failures) {
    if (!failure) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const std::runtime_error& error) {
      if (std::string(error.what()).starts_with("thread group abandoned")) {
        if (!first) first = failure;
        continue;
      }
      std::rethrow_exception(failure);
    } catch (...) {
      throw;
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace tandem::production
