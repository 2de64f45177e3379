// The one-rank collectives and the vector form of all_gather_host (collectives.hpp).
#include "production/collectives/collectives.hpp"

#include <algorithm>
#include <stdexcept>

namespace tandem::production::inline TANDEM_PRODUCTION_ARITHMETIC {
namespace {

class SingleRank final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string description() const override { return "one rank"; }
  void all_gather_host(const double* sent, double* received, std::int64_t count) override {
    std::copy(sent, sent + count, received);
  }
  void send_receive(const Real* sent, int to, Real* received, int from, std::int64_t count) override {
    // Host or device memory alike would need the backend; the trainer never calls the data plane
    // with one rank (there is nothing to exchange), so reaching this is a bug.
    (void)sent, (void)to, (void)received, (void)from, (void)count;
    throw std::logic_error("single_rank_collectives: send_receive is never needed with one rank");
  }
  void all_gather_in_place(void* buffer, std::int64_t chunk_bytes) override {
    (void)buffer, (void)chunk_bytes;  // one rank already holds every part
  }
  void exchange_with_peers(const PeerExchange& exchange) override {
    if (!exchange.empty()) {
      throw std::logic_error("single_rank_collectives: a point-to-point exchange with rank " +
                             std::to_string(exchange.sends.empty() ? exchange.receives.front().from
                                                                   : exchange.sends.front().to) +
                             " of one rank");
    }
  }
  void barrier() override {}
};

}  // namespace

std::shared_ptr<Collectives> single_rank_collectives() { return std::make_shared<SingleRank>(); }

std::vector<double> all_gather_values(Collectives& collectives, std::span<const double> values) {
  std::vector<double> received(values.size() * static_cast<std::size_t>(collectives.size()));
  collectives.all_gather_host(values.data(), received.data(), static_cast<std::int64_t>(values.size()));
  return received;
}

std::vector<std::string> all_gather_strings(Collectives& collectives, const std::string& text) {
  const double length = static_cast<double>(text.size());
  const std::vector<double> lengths = all_gather_values(collectives, std::span(&length, 1));
  const auto longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<double> bytes(longest, 0.0);
  std::transform(text.begin(), text.end(), bytes.begin(),
                 [](char c) { return static_cast<double>(static_cast<unsigned char>(c)); });
  const std::vector<double> all = all_gather_values(collectives, bytes);
  std::vector<std::string> texts(lengths.size());
  for (std::size_t rank = 0; rank < texts.size(); ++rank) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(rank * longest);
    texts[rank].resize(static_cast<std::size_t>(lengths[rank]));
    std::transform(begin, begin + static_cast<std::ptrdiff_t>(texts[rank].size()), texts[rank].begin(),
                   [](double byte) { return static_cast<char>(static_cast<unsigned char>(byte)); });
  }
  return texts;
}

}  // namespace tandem::production
