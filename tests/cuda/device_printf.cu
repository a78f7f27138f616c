// SPDX-License-Identifier: Apache-2.0 OR MIT
// Device printf reaches the program's stdout, complete, at the synchronisation that flushes it:
// the program points its stdout at a file, launches kernels that print (one line per thread of
// 4 blocks, then a kernel printing several formats), synchronises, and reads the file back.
// Lines of different threads may come in any order, so they are counted and compared sorted.
// A child process that prints from a kernel and exits without synchronising: NVIDIA's runtime
// (13.0, driver 580) drops that output, qcuda's flushes it at exit; either way no line may be
// garbled or repeated.
#define TEST_NAME "device_printf"
#include "selfcheck.cuh"

#include <algorithm>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

__global__ void hello(int tag)
{
    printf("hello %d from block %d thread %d\n", tag, blockIdx.x, threadIdx.x);
}

__global__ void goodbye()
{
    printf("bye from thread %d\n", threadIdx.x);
}

// Forks a child (before this process touches CUDA) that prints from a kernel and exits without
// synchronising; returns what it wrote to its stdout.
static std::string child_exit_output()
{
    int p[2];
    if (pipe(p) != 0)
        fail("pipe failed");
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 1);
        int n = 0;
        if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
            goodbye<<<1, 4>>>();
            cudaGetLastError();
        }
        std::exit(0); // no synchronisation: the runtime's exit path must flush it
    }
    close(p[1]);
    std::string text;
    char buf[1024];
    for (ssize_t n; (n = read(p[0], buf, sizeof buf)) > 0;)
        text.append(buf, (size_t)n);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return text;
}

__global__ void formats(long long big, double x, const char *s)
{
    printf("fmt %lld %.3f %s %c %x\n", big, x, "const", 'q', 0xbeef);
    (void)s;
}

// Runs `body` with the process's stdout redirected to a temporary file and returns what was
// written there.
template <class Body> static std::string capture_stdout(Body body)
{
    char path[] = "/tmp/qcuda-printf-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        fail("mkstemp failed");
    std::fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    body();
    std::fflush(stdout);
    dup2(saved, 1);
    close(saved);
    std::string text;
    char buf[4096];
    lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;)
        text.append(buf, (size_t)n);
    close(fd);
    unlink(path);
    return text;
}

static std::vector<std::string> lines(const std::string &text)
{
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
        out.push_back(text.substr(at, nl - at));
    return out;
}

int main()
{
    std::string at_exit = child_exit_output();
    require_device();
    {
        std::vector<std::string> got = lines(at_exit);
        std::sort(got.begin(), got.end());
        std::vector<std::string> want = {"bye from thread 0", "bye from thread 1",
                                         "bye from thread 2", "bye from thread 3"};
        if (!got.empty() && got != want)
            fail("a child's unsynchronised kernel output at exit: '%s'", at_exit.c_str());
        std::printf("unsynchronised output at exit: %s\n",
                    got.empty() ? "dropped (as NVIDIA's runtime does)" : "flushed, complete");
    }
    size_t fifo = 0;
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    std::printf("printf FIFO: %zu bytes\n", fifo);

    std::string text = capture_stdout([] {
        std::printf("host before\n");
        hello<<<4, 32>>>(7);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        std::printf("host after\n");
    });
    std::vector<std::string> got = lines(text);
    if (got.size() != 4 * 32 + 2)
        fail("%zu lines captured, expected %d:\n%s", got.size(), 4 * 32 + 2, text.c_str());
    if (got.front() != "host before" || got.back() != "host after")
        fail("device output is not between the host's lines before and after the "
             "synchronisation:\n%s", text.c_str());
    std::vector<std::string> want;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 32; t++)
            want.push_back("hello 7 from block " + std::to_string(b) + " thread " +
                           std::to_string(t));
    std::vector<std::string> dev(got.begin() + 1, got.end() - 1);
    std::sort(dev.begin(), dev.end());
    std::sort(want.begin(), want.end());
    if (dev != want)
        fail("device lines differ from the expected 128:\n%s", text.c_str());

    // Formats, and output flushed by a stream synchronisation.
    text = capture_stdout([] {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        formats<<<1, 1, 0, s>>>(1234567890123LL, 3.14159, nullptr);
        CHECK_LAUNCH();
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaStreamDestroy(s));
    });
    if (text != "fmt 1234567890123 3.142 const q beef\n")
        fail("formatted device output: '%s'", text.c_str());
    std::printf("device printf: 128 lines and formats arrived in order with the host's\n");
    return pass();
}
