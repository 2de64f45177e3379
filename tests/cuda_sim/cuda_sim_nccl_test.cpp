// cuda-sim's NCCL (cuda_sim/nccl.cpp): communicators over ranks on threads, each on a device of
// its own; the collectives on the ranks' streams give exactly the bytes NCCL's would; what NCCL
// would hang on or corrupt (ranks that disagree, a rank that never arrives, a device twice) is an
// error naming the ranks and the call.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

// body(rank, comm, stream) on `ranks` threads, rank r on device r with a stream of its own.
void on_ranks(int ranks, const std::function<void(int, ncclComm_t, cudaStream_t)>& body) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      ncclComm_t comm = nullptr;
      ASSERT_EQ(ncclCommInitRank(&comm, ranks, id, rank), ncclSuccess) << ncclGetLastError(nullptr);
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      body(rank, comm, stream);
      cudaStreamDestroy(stream);
      ncclCommDestroy(comm);
    });
  }
  for (auto& thread : threads) thread.join();
}

// The sticky error's text after a rank's stream failed, then a clean runtime for the next test.
std::string failure_text(cudaStream_t stream) {
  const cudaError_t status = cudaStreamSynchronize(stream);
  return status == cudaSuccess ? "" : cudaGetErrorString(status);
}

class CudaSimNccl : public ::testing::Test {
 protected:
  void TearDown() override {
    tandem::cuda_sim::set_nccl_timeout_seconds(0);
    cudaDeviceReset();
  }
};

TEST_F(CudaSimNccl, AllGatherInPlaceGivesEveryRankEveryRanksPart) {
  constexpr int kRanks = 4;
  constexpr int kChunk = 3;  // floats a rank
  std::vector<std::vector<float>> results(kRanks);
  on_ranks(kRanks, [&](int rank, ncclComm_t comm, cudaStream_t stream) {
    float* buffer = nullptr;  // [kRanks, kChunk]
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), kRanks * kChunk * sizeof(float)), cudaSuccess);
    std::vector<float> mine(kRanks * kChunk, -1.0f);
    for (int i = 0; i < kChunk; ++i) mine[static_cast<std::size_t>(rank * kChunk + i)] = 10.0f * rank + i;
    cudaMemcpyAsync(buffer, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice, nullptr);
    ASSERT_EQ(ncclAllGather(buffer + rank * kChunk, buffer, kChunk, ncclFloat32, comm, stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    results[static_cast<std::size_t>(rank)].resize(mine.size());
    cudaMemcpyAsync(results[static_cast<std::size_t>(rank)].data(), buffer, mine.size() * sizeof(float),
               cudaMemcpyDeviceToHost, nullptr);
    cudaFree(buffer);
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int owner = 0; owner < kRanks; ++owner) {
      for (int i = 0; i < kChunk; ++i) {
        EXPECT_EQ(results[static_cast<std::size_t>(rank)][static_cast<std::size_t>(owner * kChunk + i)],
                  10.0f * owner + i)
            << "rank " << rank << " owner " << owner << " element " << i;
      }
    }
  }
}

TEST_F(CudaSimNccl, TwoRanksSendEachOtherTwoMessagesInOneGroupEachInOrder) {
  std::vector<std::vector<int>> received(2);
  on_ranks(2, [&](int rank, ncclComm_t comm, cudaStream_t stream) {
    int* buffer = nullptr;  // [4]: two to send, two received
    cudaMalloc(reinterpret_cast<void**>(&buffer), 4 * sizeof(int));
    const std::vector<int> sent = {100 * rank + 1, 100 * rank + 2, 0, 0};
    cudaMemcpyAsync(buffer, sent.data(), sent.size() * sizeof(int), cudaMemcpyHostToDevice, nullptr);
    const int peer = 1 - rank;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(buffer, 1, ncclInt32, peer, comm, stream), ncclSuccess);
    ASSERT_EQ(ncclSend(buffer + 1, 1, ncclInt32, peer, comm, stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(buffer + 2, 1, ncclInt32, peer, comm, stream), ncclSuccess);
    ASSERT_EQ(ncclRecv(buffer + 3, 1, ncclInt32, peer, comm, stream), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    received[static_cast<std::size_t>(rank)].resize(2);
    cudaMemcpyAsync(received[static_cast<std::size_t>(rank)].data(), buffer + 2, 2 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
    cudaFree(buffer);
  });
  EXPECT_EQ(received[0], (std::vector<int>{101, 102}));  // rank 1's, in the order sent
  EXPECT_EQ(received[1], (std::vector<int>{1, 2}));
}

TEST_F(CudaSimNccl, RanksThatDisagreeOnTheCountFailNamingBothRanks) {
  tandem::cuda_sim::set_nccl_timeout_seconds(20);
  std::vector<std::string> texts(2);
  on_ranks(2, [&](int rank, ncclComm_t comm, cudaStream_t stream) {
    char* buffer = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&buffer), 64);
    const std::size_t count = rank == 0 ? 16 : 8;
    ASSERT_EQ(ncclAllGather(buffer + rank * count, buffer, count, ncclInt8, comm, stream), ncclSuccess);
    texts[static_cast<std::size_t>(rank)] = failure_text(stream);
    cudaFree(buffer);
  });
  for (const std::string& text : texts) {
    EXPECT_NE(text.find("ncclAllGather (call 1 on the communicator)"), std::string::npos) << text;
    EXPECT_NE(text.find("16 x ncclInt8"), std::string::npos) << text;
    EXPECT_NE(text.find("8 x ncclInt8"), std::string::npos) << text;
  }
}

TEST_F(CudaSimNccl, ARankThatNeverIssuesTheCollectiveIsATimeoutNamingIt) {
  tandem::cuda_sim::set_nccl_timeout_seconds(0.5);
  std::string text;
  on_ranks(2, [&](int rank, ncclComm_t comm, cudaStream_t stream) {
    if (rank == 1) return;  // never issues it
    char* buffer = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&buffer), 8);
    ASSERT_EQ(ncclAllGather(buffer, buffer, 4, ncclInt8, comm, stream), ncclSuccess);
    text = failure_text(stream);
    cudaFree(buffer);
  });
  EXPECT_NE(text.find("ncclAllGather (call 1 on the communicator) on rank 0: rank 1 of 2 never issued it within 0.5 s"),
            std::string::npos)
      << text;
}

TEST_F(CudaSimNccl, UngroupedSendsThatFaceEachOtherWaitAsOnNcclAndTimeOut) {
  tandem::cuda_sim::set_nccl_timeout_seconds(0.5);
  std::vector<std::string> texts(2);
  on_ranks(2, [&](int rank, ncclComm_t comm, cudaStream_t stream) {
    float* buffer = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&buffer), 2 * sizeof(float));
    ASSERT_EQ(ncclSend(buffer, 1, ncclFloat32, 1 - rank, comm, stream), ncclSuccess);  // no group
    ASSERT_EQ(ncclRecv(buffer + 1, 1, ncclFloat32, 1 - rank, comm, stream), ncclSuccess);
    texts[static_cast<std::size_t>(rank)] = failure_text(stream);
    cudaFree(buffer);
  });
  for (const std::string& text : texts) {
    EXPECT_NE(text.find("no matching ncclRecv within 0.5 s"), std::string::npos) << text;
  }
}

TEST_F(CudaSimNccl, TwoRanksOnOneDeviceAreRefusedAsNcclRefusesThem) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  tandem::cuda_sim::set_nccl_timeout_seconds(2);
  std::vector<ncclResult_t> results(2, ncclSuccess);
  std::vector<std::string> texts(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      cudaSetDevice(0);
      ncclComm_t comm = nullptr;
      results[static_cast<std::size_t>(rank)] = ncclCommInitRank(&comm, 2, id, rank);
      texts[static_cast<std::size_t>(rank)] = ncclGetLastError(nullptr);
      if (results[static_cast<std::size_t>(rank)] == ncclSuccess) ncclCommDestroy(comm);
    });
  }
  for (auto& thread : threads) thread.join();
  // The second to join is refused; the first then waits for a rank that never joins.
  const int refused = results[0] == ncclInvalidUsage ? 0 : 1;
  EXPECT_EQ(results[static_cast<std::size_t>(refused)], ncclInvalidUsage);
  EXPECT_NE(texts[static_cast<std::size_t>(refused)].find("duplicate GPU detected"), std::string::npos)
      << texts[static_cast<std::size_t>(refused)];
  EXPECT_EQ(results[static_cast<std::size_t>(1 - refused)], ncclSystemError);
  EXPECT_NE(texts[static_cast<std::size_t>(1 - refused)].find("never joined within 2 s"), std::string::npos)
      << texts[static_cast<std::size_t>(1 - refused)];
}

}  // namespace
