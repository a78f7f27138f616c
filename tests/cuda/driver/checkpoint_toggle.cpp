// CUDA's process checkpoint driven from another process, as NVIDIA's cuda-checkpoint does it,
// through the driver API only (cuCheckpointProcess*): the stand-in for cuda-checkpoint where a
// host has none, and a check of the documented state machine.
//   checkpoint_toggle toggle PID   RUNNING -> lock, checkpoint -> CHECKPOINTED, or CHECKPOINTED ->
//                                  restore, unlock -> RUNNING (as cuda-checkpoint --toggle)
//   checkpoint_toggle state PID    prints "STATE <name>"
//   checkpoint_toggle check PID    on a running CUDA process: every action in the wrong state is
//                                  CUDA_ERROR_ILLEGAL_STATE, the right ones move it round the
//                                  states and back to RUNNING; prints PASS/FAIL. Also prints
//                                  "INFO" lines with what a pid without CUDA and another user
//                                  get (the harness compares them with a native run's)
//   checkpoint_toggle              the self-test the CUDA test runs use: a child process with
//                                  device memory is checked as above, toggled off and on, and
//                                  must then read its memory back unchanged
// Exits 0 on success, 1 on failure, 2 without a driver/GPU (SKIP).
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#define NAME "checkpoint_toggle"

static const char *err(CUresult r) {
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

static const char *state_name(CUprocessState s) {
    switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "RUNNING";
    case CU_PROCESS_STATE_LOCKED: return "LOCKED";
    case CU_PROCESS_STATE_CHECKPOINTED: return "CHECKPOINTED";
    case CU_PROCESS_STATE_FAILED: return "FAILED";
    default: return "UNKNOWN";
    }
}

static int failures = 0;
#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != (want)) {                                                                        \
            std::printf("FAIL " NAME ": %s -> %s, expected %s (line %d)\n", #call, err(r_),      \
                        err(want), __LINE__);                                                      \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static CUresult get_state(int pid, CUprocessState *s) { return cuCheckpointProcessGetState(pid, s); }

static void expect_state(int pid, CUprocessState want, int line) {
    CUprocessState s = CU_PROCESS_STATE_FAILED;
    CUresult r = get_state(pid, &s);
    if (r != CUDA_SUCCESS || s != want) {
        std::printf("FAIL " NAME ": state %s (%s), expected %s (line %d)\n", state_name(s), err(r),
                    state_name(want), line);
        failures++;
    }
}
#define STATE(pid, want) expect_state(pid, want, __LINE__)

static int toggle(int pid) {
    CUprocessState s;
    CUresult r = get_state(pid, &s);
    if (r != CUDA_SUCCESS) {
        std::printf("FAIL " NAME ": cuCheckpointProcessGetState(%d) -> %s\n", pid, err(r));
        return 1;
    }
    if (s == CU_PROCESS_STATE_RUNNING) {
        if ((r = cuCheckpointProcessLock(pid, nullptr)) == CUDA_SUCCESS)
            r = cuCheckpointProcessCheckpoint(pid, nullptr);
    } else if (s == CU_PROCESS_STATE_CHECKPOINTED) {
        if ((r = cuCheckpointProcessRestore(pid, nullptr)) == CUDA_SUCCESS)
            r = cuCheckpointProcessUnlock(pid, nullptr);
    } else {
        std::printf("FAIL " NAME ": process %d is %s\n", pid, state_name(s));
        return 1;
    }
    if (r != CUDA_SUCCESS) {
        std::printf("FAIL " NAME ": toggling %d -> %s\n", pid, err(r));
        return 1;
    }
    get_state(pid, &s);
    std::printf("TOGGLED %d %s\n", pid, state_name(s));
    return 0;
}

// What another user gets when it tries to lock `pid` (run as root: the child drops to nobody).
static void as_other_user(int pid) {
    pid_t child = fork();
    if (child == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        CUresult r = cuInit(0);
        if (r == CUDA_SUCCESS) r = cuCheckpointProcessLock(pid, nullptr);
        std::printf("INFO other user locking: %s\n", err(r));
        std::fflush(stdout);
        if (r == CUDA_SUCCESS) cuCheckpointProcessUnlock(pid, nullptr);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
}

static int check(int pid) {
    CUcheckpointLockArgs lock;
    std::memset(&lock, 0, sizeof lock);
    lock.timeoutMs = 30000;
    STATE(pid, CU_PROCESS_STATE_RUNNING);
    EXPECT(cuCheckpointProcessUnlock(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessCheckpoint(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessRestore(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessLock(pid, &lock), CUDA_SUCCESS);
    STATE(pid, CU_PROCESS_STATE_LOCKED);
    EXPECT(cuCheckpointProcessLock(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessRestore(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessCheckpoint(pid, nullptr), CUDA_SUCCESS);
    STATE(pid, CU_PROCESS_STATE_CHECKPOINTED);
    EXPECT(cuCheckpointProcessUnlock(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessCheckpoint(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessLock(pid, nullptr), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuCheckpointProcessRestore(pid, nullptr), CUDA_SUCCESS);
    STATE(pid, CU_PROCESS_STATE_LOCKED);
    EXPECT(cuCheckpointProcessUnlock(pid, nullptr), CUDA_SUCCESS);
    STATE(pid, CU_PROCESS_STATE_RUNNING);
    int tid = 0;
    EXPECT(cuCheckpointProcessGetRestoreThreadId(pid, &tid), CUDA_SUCCESS);
    if (tid <= 0) {
        std::printf("FAIL " NAME ": restore thread id %d\n", tid);
        failures++;
    }
    EXPECT(cuCheckpointProcessGetState(pid, nullptr), CUDA_ERROR_INVALID_VALUE);
    // This process never made a context: what "no CUDA" looks like (compared with native).
    CUprocessState s;
    std::printf("INFO process without a context: %s\n", err(get_state(getpid(), &s)));
    std::printf("INFO no such process: %s\n", err(get_state(0x3ffffff0, &s)));
    if (getuid() == 0) as_other_user(pid);
    STATE(pid, CU_PROCESS_STATE_RUNNING);
    if (failures) return 1;
    std::printf("PASS " NAME "\n");
    return 0;
}

// The self-test's child: device memory with a pattern, then (once told) the pattern read back.
static int child_main(int ready_fd, int go_fd) {
    char b = 'x';
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0;
    unsigned int words[1024];
    for (unsigned i = 0; i < 1024; i++) words[i] = i * 2654435761u;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuMemAlloc(&p, sizeof words) != CUDA_SUCCESS ||
        cuMemcpyHtoD(p, words, sizeof words) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS) {
        (void)!write(ready_fd, &b, 1);
        return 2;
    }
    b = 'r';
    if (write(ready_fd, &b, 1) != 1 || read(go_fd, &b, 1) != 1) return 1;
    unsigned int back[1024] = {0};
    if (cuMemcpyDtoH(back, p, sizeof back) != CUDA_SUCCESS) return 1;
    return std::memcmp(back, words, sizeof words) == 0 ? 0 : 1;
}

static int self_test() {
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) return 1;
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        close(go[1]);
        _exit(child_main(ready[1], go[0]));
    }
    close(ready[1]);
    close(go[0]);
    char b = 0;
    if (read(ready[0], &b, 1) != 1 || b != 'r') {
        int status = 0;
        waitpid(child, &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
            std::printf("SKIP " NAME ": the child has no CUDA device\n");
            return 2;
        }
        std::printf("FAIL " NAME ": the child did not start\n");
        return 1;
    }
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        std::printf("SKIP " NAME ": cuInit -> %s\n", err(r));
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        return 2;
    }
    int rc = check(child);
    if (rc == 0) rc = toggle(child) || toggle(child);
    b = 'g';
    if (write(go[1], &b, 1) != 1) rc = 1;
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("FAIL " NAME ": the child's memory after the checkpoint (status %d)\n", status);
        rc = 1;
    }
    if (rc == 0) std::printf("PASS " NAME " (self-test)\n");
    return rc;
}

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc == 1) return self_test();
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s toggle|state|check PID\n", argv[0]);
        return 2;
    }
    int pid = std::atoi(argv[2]);
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        std::printf("SKIP " NAME ": cuInit -> %s\n", err(r));
        return 2;
    }
    if (!std::strcmp(argv[1], "toggle")) return toggle(pid);
    if (!std::strcmp(argv[1], "state")) {
        CUprocessState s;
        r = get_state(pid, &s);
        if (r != CUDA_SUCCESS) {
            std::printf("STATE error %s\n", err(r));
            return 1;
        }
        std::printf("STATE %s\n", state_name(s));
        return 0;
    }
    if (!std::strcmp(argv[1], "check")) return check(pid);
    std::fprintf(stderr, "usage: %s toggle|state|check PID\n", argv[0]);
    return 2;
}
