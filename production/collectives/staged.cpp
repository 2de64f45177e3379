// Device memory through host-memory collectives (staged.hpp).
#include "production/collectives/staged.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

class HostStagedCollectives final : public Collectives {
 public:
  HostStagedCollectives(Backend& backend, std::shared_ptr<Collectives> host)
      : backend_(&backend), host_(std::move(host)) {
    if (!host_) throw std::invalid_argument("make_host_staged_collectives: no host collectives");
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string description() const override {
    return "staged through host memory (ranks share a device) over " + host_->description();
  }
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    host_->all_gather_host(sent, received, count);
  }
  void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) override {
    const auto bytes = count * static_cast<std::int64_t>(sizeof(Real));
    std::vector<Real> outgoing(static_cast<std::size_t>(count));
    std::vector<Real> incoming(static_cast<std::size_t>(count));
    backend_->synchronize();
    if (count > 0) backend_->copy_to_host(outgoing.data(), sent, bytes);
    host_->send_receive(outgoing.data(), to, incoming.data(), from, count);
    if (count > 0) backend_->copy_from_host(received, incoming.data(), bytes);
  }
  void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) override {
    const std::int64_t total = chunk_bytes * size();
    std::vector<std::uint8_t> staged(static_cast<std::size_t>(total));
    backend_->synchronize();
    if (total > 0) backend_->copy_to_host(staged.data(), buffer, total);
    host_->all_gather_in_place(staged.data(), chunk_bytes);
    if (total > 0) backend_->copy_from_host(buffer, staged.data(), total);
  }
  void exchange_with_peers(const PeerExchange& exchange) override {
    std::vector<std::vector<std::uint8_t>> outgoing;
    std::vector<std::vector<std::uint8_t>> incoming;
    PeerExchange staged;
    backend_->synchronize();
    for (const PeerSend& send : exchange.sends) {
      outgoing.emplace_back(static_cast<std::size_t>(send.bytes));
      if (send.bytes > 0) backend_->copy_to_host(outgoing.back().data(), send.data, send.bytes);
      staged.sends.push_back({outgoing.back().data(), send.bytes, send.to});
    }
    for (const PeerReceive& receive : exchange.receives) {
      incoming.emplace_back(static_cast<std::size_t>(receive.bytes));
      staged.receives.push_back({incoming.back().data(), receive.bytes, receive.from});
    }
    host_->exchange_with_peers(staged);
    for (std::size_t i = 0; i < exchange.receives.size(); ++i) {
      const PeerReceive& receive = exchange.receives[i];
      if (receive.bytes > 0) backend_->copy_from_host(receive.data, incoming[i].data(), receive.bytes);
    }
  }
  void barrier() override {
    backend_->synchronize();
    host_->barrier();
  }
  bool callable_from_other_threads() const override { return false; }

 private:
  Backend* backend_ = nullptr;
  std::shared_ptr<Collectives> host_;
};

}  // namespace

std::shared_ptr<Collectives> make_host_staged_collectives(Backend& backend, std::shared_ptr<Collectives> host) {
  return std::make_shared<HostStagedCollectives>(backend, std::move(host));
}

}  // namespace tandem::production
