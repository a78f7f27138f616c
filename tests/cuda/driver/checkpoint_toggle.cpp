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
// Exits 0 on success, 1 on failure, 2 without a driver/GPU (SKIP).
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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

int main(int argc, char **argv) {
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
