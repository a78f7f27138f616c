// SPDX-License-Identifier: Apache-2.0 OR MIT
// A working set of device memory moved only by copies, no kernels: the guest program of the
// pre-copy test without a GPU (scripts/test-migration.sh --program precopy-fake), whose daemon
// serves it with the fake CUDA driver, which runs no guest code. It allocates WORKING_SET_MIB
// MiB (argv[3], default 64) with cudaMalloc and fills it from a host pattern with cudaMemcpy,
// then loops ITERATIONS times (argv[1], default 200), sleeping SLEEP_US between iterations
// (argv[2], default 0). Each iteration reads back one 64 KiB sample of the set, chosen by the
// iteration, checks it against the pattern and folds it into a running hash; with REWRITE
// (argv[4], default 0) 1 it first rewrites one slice of the set (a 64th, in turn, with a
// cudaMemcpy of a pattern of that iteration and a cudaMemset of its first 4 KiB), so that the
// memory a pre-copy sent changes under it; WORKING_SET_MIB is a multiple of 64. At the end the
// whole set is read back, checked and hashed. The host side of every copy is a buffer of
// 1 MiB, so that the guest RAM a migration sends stays small beside the device memory. Prints
// "CHECKPOINT ready" after the first iteration, "RATE <iterations> <seconds> <iterations/s>"
// and "CHECKSUM <hex>", which must equal an uninterrupted run's, as checkpoint_linked_list
// does, so that scripts/test-migration.sh reads both programs alike.
#define TEST_NAME "precopy_memcpy"
#include "selfcheck.cuh"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <vector>

namespace {

constexpr size_t kSample = 64 << 10;
constexpr int kSlices = 64;
constexpr size_t kMemset = 4096;
// The host buffer of every bulk copy (a slice is a whole number of them).
constexpr size_t kPiece = 1 << 20;

// The word at index `i` of a set written with `salt` (0: the initial fill).
uint32_t pattern(size_t i, uint32_t salt)
{
    uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b1u ^ salt;
    x ^= x >> 15;
    return x * 0x85ebca6bu + 1;
}

// What the set should hold: the salt each slice was last written with.
struct Expected {
    std::vector<uint32_t> salt;
    size_t slice_bytes;
    uint32_t word(size_t i) const
    {
        size_t s = i * 4 / slice_bytes;
        size_t in_slice = i * 4 - s * slice_bytes;
        if (salt[s] != 0 && in_slice < kMemset)
            return 0x5a5a5a5au;
        return pattern(i, salt[s]);
    }
};

uint64_t fold(uint64_t h, const uint32_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ w[i]) * 0x100000001b3ULL;
    return h;
}

} // namespace

int main(int argc, char **argv)
{
    const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
    const int sleep_us = argc > 2 ? std::atoi(argv[2]) : 0;
    const size_t working_mib = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 64;
    const int rewrite = argc > 4 ? std::atoi(argv[4]) : 0;
    require_device();
    if (working_mib == 0 || working_mib % kSlices != 0 || iterations < 1)
        fail("WORKING_SET_MIB must be a multiple of %d MiB and ITERATIONS at least 1", kSlices);
    const size_t bytes = working_mib << 20, words = bytes / 4;
    Expected want{std::vector<uint32_t>(kSlices, 0), bytes / kSlices};
    std::vector<uint32_t> piece(kPiece / 4);
    uint32_t *set;
    CHECK(cudaMalloc(&set, bytes));
    for (size_t at = 0; at < words; at += piece.size()) {
        for (size_t i = 0; i < piece.size(); i++)
            piece[i] = pattern(at + i, 0);
        CHECK(cudaMemcpy(set + at, piece.data(), kPiece, cudaMemcpyHostToDevice));
    }
    std::printf("precopy_memcpy: %zu MiB written, rewrite %d\n", working_mib, rewrite);
    std::fflush(stdout);

    const size_t slice_words = want.slice_bytes / 4;
    std::vector<uint32_t> sample(kSample / 4);
    uint64_t h = 0xcbf29ce484222325ULL;
    const auto loop_start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; it++) {
        if (rewrite) {
            const int s = it % kSlices;
            const uint32_t salt = 0x9e3779b9u * static_cast<uint32_t>(it + 1) | 1;
            for (size_t done = 0; done < slice_words; done += piece.size()) {
                const size_t at = s * slice_words + done;
                for (size_t i = 0; i < piece.size(); i++)
                    piece[i] = pattern(at + i, salt);
                CHECK(cudaMemcpy(set + at, piece.data(), kPiece, cudaMemcpyHostToDevice));
            }
            CHECK(cudaMemset(set + s * slice_words, 0x5a, kMemset));
            want.salt[s] = salt;
        }
        const size_t at = (static_cast<size_t>(it) * 7919 * kSample) % (bytes - kSample + 1) / 4;
        CHECK(cudaMemcpy(sample.data(), set + at, kSample, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < sample.size(); i++)
            if (sample[i] != want.word(at + i))
                fail("iteration %d: word %zu is %08x, not %08x", it, at + i, sample[i],
                     want.word(at + i));
        h = fold(h, sample.data(), sample.size());
        if (it == 0) {
            std::printf("CHECKPOINT ready\n");
            std::fflush(stdout);
        }
        if (sleep_us > 0)
            usleep(sleep_us);
    }
    const double loop_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    std::printf("RATE %d %.3f %.2f\n", iterations, loop_s, loop_s > 0 ? iterations / loop_s : 0.0);

    for (size_t at = 0; at < words; at += piece.size()) {
        CHECK(cudaMemcpy(piece.data(), set + at, kPiece, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < piece.size(); i++)
            if (piece[i] != want.word(at + i))
                fail("word %zu of the %zu MiB working set is %08x, not %08x", at + i,
                     working_mib, piece[i], want.word(at + i));
        h = fold(h, piece.data(), piece.size());
    }
    CHECK(cudaFree(set));
    std::printf("CHECKSUM %016llx\n", static_cast<unsigned long long>(h));
    return pass();
}
