// SPDX-License-Identifier: Apache-2.0 OR MIT
// qcuda-transport-test: exercises qcuda.ko's ioctl ABI inside the guest, against a live
// vhost-cuda (it needs the Hello and Echo ops only).
//
//   qcuda-transport-test [all|basic|validate|echo|e2big|concurrency|signals|kill|host-memory|process|unplug]
//
// `unplug` calls until the device is removed (e.g. `echo virtio0 >
// /sys/bus/virtio/drivers/qcuda/unbind` from a script) and expects ENODEV; see
// qcuda-remove-test.sh.
// The ABI below mirrors qcuda-proto/src/wire.rs (`wire::ioctl`); _Static_asserts pin the
// layout. Prints one line per check and a final "N passed, N failed" line; exit 0 iff all pass.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct qcuda_buffer {
	uint64_t addr;
	uint64_t len;
	uint32_t dir;
	uint32_t reserved;
};

struct qcuda_call {
	uint32_t op, flags, device, nbufs;
	uint32_t status, resp_flags;
	uint64_t args[8];
	uint64_t rets[7];
	struct qcuda_buffer bufs[8];
};
_Static_assert(sizeof(struct qcuda_call) == 336, "IOCTL_CALL_SIZE");
_Static_assert(offsetof(struct qcuda_call, rets) == 88, "rets");
_Static_assert(offsetof(struct qcuda_call, bufs) == 144, "bufs");

#define QCUDA_IOCTL_CALL _IOWR('Q', 0x01, struct qcuda_call)

struct qcuda_host_map {
	uint64_t addr, len, flags;
	uint32_t device, status;
	uint64_t dev_addr;
};
_Static_assert(sizeof(struct qcuda_host_map) == 40, "HOST_MAP_CALL_SIZE");
#define QCUDA_IOCTL_HOST_MAP _IOWR('Q', 0x02, struct qcuda_host_map)
#define QCUDA_IOCTL_HOST_UNMAP _IOWR('Q', 0x03, struct qcuda_host_map)
#define HOST_MEMORY_NOT_REGISTERED 713
#define DIR_IN 1
#define DIR_OUT 2
#define OP_HELLO 0x0001
#define OP_ECHO 0x0002
#define OP_HOST_INFO 0x0003
#define OP_SESSION_CLOSE 0x80000001u
#define OP_PROCESS_CHECKPOINT 0x0280
#define OP_GPU_TRACE 0x0290
enum { P_GET_STATE, P_LOCK, P_CHECKPOINT, P_RESTORE, P_UNLOCK, P_RESTORE_THREAD };
enum { S_RUNNING, S_LOCKED, S_CHECKPOINTED };
#define INVALID_VALUE 1
#define INITIALIZATION_ERROR 3
#define NOT_READY 600
#define ILLEGAL_STATE 401
#define NOT_PERMITTED 800
#define FLAG_ASYNC 1
#define MAX_BUFFER_LEN (64ull << 20)
#define WIRE_VERSION 1

static int passed, failed;
static const char *dev_path = "/dev/qcuda";

#define CHECK(cond, ...)                                   \
	do {                                               \
		if (cond) {                                \
			passed++;                          \
			printf("ok   ");                   \
		} else {                                   \
			failed++;                          \
			printf("FAIL ");                   \
		}                                          \
		printf(__VA_ARGS__);                       \
		printf("\n");                              \
		fflush(stdout);                            \
	} while (0)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int open_dev(void)
{
	int fd = open(dev_path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "open %s: %s\n", dev_path, strerror(errno));
		exit(2);
	}
	return fd;
}

/* ioctl; returns 0 or -errno. */
static int call(int fd, struct qcuda_call *c)
{
	return ioctl(fd, QCUDA_IOCTL_CALL, c) == 0 ? 0 : -errno;
}

/* A field of /proc/self/fdinfo/<fd> (written by qcuda.ko's show_fdinfo), or -1. */
static long fdinfo(int fd, const char *key)
{
	char path[64], line[128];
	snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
	FILE *f = fopen(path, "r");
	long v = -1;
	size_t n = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static void check_drained(int fd, const char *after);

static void hello_call(struct qcuda_call *c)
{
	memset(c, 0, sizeof *c);
	c->op = OP_HELLO;
	c->args[0] = WIRE_VERSION;
}

static void echo_call(struct qcuda_call *c, const void *in, void *out, uint64_t len)
{
	memset(c, 0, sizeof *c);
	c->op = OP_ECHO;
	c->nbufs = 2;
	c->bufs[0] = (struct qcuda_buffer){ (uintptr_t)in, len, DIR_IN, 0 };
	c->bufs[1] = (struct qcuda_buffer){ (uintptr_t)out, len, DIR_OUT, 0 };
}

static void fill(unsigned char *p, size_t len, unsigned seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

/* One echo round trip of `len` bytes at offset `skew` into fresh buffers; 0 on success. */
static int echo_once(int fd, size_t len, size_t skew, unsigned seed, double *secs)
{
	size_t map = len + skew + 4096;
	unsigned char *in = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *out = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (in == MAP_FAILED || out == MAP_FAILED)
		return -ENOMEM;
	fill(in + skew, len, seed);
	memset(out, 0xa5, map);
	struct qcuda_call c;
	echo_call(&c, in + skew, out + skew, len);
	double t0 = now();
	int rc = call(fd, &c);
	if (secs)
		*secs = now() - t0;
	if (rc == 0 && c.status != 0)
		rc = 1000 + (int)c.status;
	if (rc == 0 && memcmp(in + skew, out + skew, len) != 0)
		rc = 1;
	/* Bytes around the output must be untouched. */
	if (rc == 0 && ((skew && out[skew - 1] != 0xa5) || out[skew + len] != 0xa5))
		rc = 2;
	munmap(in, map);
	munmap(out, map);
	return rc;
}

static void test_basic(void)
{
	int fd = open_dev();
	struct qcuda_call c;
	hello_call(&c);
	int rc = call(fd, &c);
	CHECK(rc == 0 && c.status == 0 && c.rets[0] == WIRE_VERSION,
	      "hello: rc %d status %u host version %llu gpus %llu driver %llu sessions %llu", rc,
	      c.status, (unsigned long long)c.rets[0], (unsigned long long)c.rets[1],
	      (unsigned long long)c.rets[2], (unsigned long long)c.rets[3]);
	hello_call(&c);
	c.flags = FLAG_ASYNC;
	rc = call(fd, &c);
	CHECK(rc == 0 && c.status == 0, "async hello: rc %d status %u", rc, c.status);
	hello_call(&c);
	rc = call(fd, &c);
	CHECK(rc == 0 && c.status == 0, "hello after async: rc %d", rc);
	long session = fdinfo(fd, "qcuda-session");
	int fd2 = open_dev();
	long session2 = fdinfo(fd2, "qcuda-session");
	CHECK(session > 0 && session2 > session, "session ids per open file: %ld, %ld", session, session2);
	close(fd2);
	for (int i = 0; i < 500; i++) {
		hello_call(&c);
		c.flags = FLAG_ASYNC;
		if ((rc = call(fd, &c)) != 0)
			break;
	}
	CHECK(rc == 0, "500 async hellos: rc %d", rc);
	check_drained(fd, "async calls");
	close(fd);
}

static void test_validate(void)
{
	int fd = open_dev();
	struct qcuda_call c;
	unsigned char small[64], big_ok[64];
	int rc;

	rc = ioctl(fd, _IO('Q', 0x02), 0) == 0 ? 0 : -errno;
	CHECK(rc == -ENOTTY, "unknown ioctl -> ENOTTY (%d)", rc);
	rc = ioctl(fd, _IOWR('Q', 0x01, uint64_t), &c) == 0 ? 0 : -errno;
	CHECK(rc == -ENOTTY, "call with wrong size in cmd -> ENOTTY (%d)", rc);
	rc = ioctl(fd, QCUDA_IOCTL_CALL, NULL) == 0 ? 0 : -errno;
	CHECK(rc == -EFAULT, "NULL argument -> EFAULT (%d)", rc);
	rc = ioctl(fd, QCUDA_IOCTL_CALL, (void *)0xffffffffff600000ull) == 0 ? 0 : -errno;
	CHECK(rc == -EFAULT, "kernel-address argument -> EFAULT (%d)", rc);
	/* The argument straddles the end of a mapping. */
	unsigned char *edge = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(edge + 4096, 4096);
	rc = ioctl(fd, QCUDA_IOCTL_CALL, edge + 4096 - 100) == 0 ? 0 : -errno;
	CHECK(rc == -EFAULT, "argument crossing into unmapped page -> EFAULT (%d)", rc);

	hello_call(&c);
	c.op = 0x7777;
	CHECK((rc = call(fd, &c)) == -EINVAL, "unknown op -> EINVAL (%d)", rc);
	hello_call(&c);
	c.op = OP_SESSION_CLOSE;
	CHECK((rc = call(fd, &c)) == -EINVAL, "kernel-only op from user space -> EINVAL (%d)", rc);
	hello_call(&c);
	c.flags = 0x100;
	CHECK((rc = call(fd, &c)) == -EINVAL, "unknown flag -> EINVAL (%d)", rc);
	hello_call(&c);
	c.nbufs = 9;
	CHECK((rc = call(fd, &c)) == -EINVAL, "nbufs 9 -> EINVAL (%d)", rc);
	hello_call(&c);
	c.nbufs = 0xffffffff;
	CHECK((rc = call(fd, &c)) == -EINVAL, "nbufs 2^32-1 -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.nbufs = 1;
	CHECK((rc = call(fd, &c)) == -EINVAL, "echo with one buffer (bad shape) -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.bufs[0].dir = 3;
	CHECK((rc = call(fd, &c)) == -EINVAL, "direction 3 -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.bufs[0].dir = 0;
	CHECK((rc = call(fd, &c)) == -EINVAL, "direction 0 -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.bufs[0].dir = DIR_OUT;
	c.bufs[1].dir = DIR_IN;
	CHECK((rc = call(fd, &c)) == -EINVAL, "In after Out -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.bufs[1].reserved = 1;
	CHECK((rc = call(fd, &c)) == -EINVAL, "reserved field set -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, MAX_BUFFER_LEN + 1);
	CHECK((rc = call(fd, &c)) == -EINVAL, "buffer longer than MAX_BUFFER_LEN -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, ~0ull);
	CHECK((rc = call(fd, &c)) == -EINVAL, "buffer length 2^64-1 -> EINVAL (%d)", rc);
	echo_call(&c, small, big_ok, sizeof small);
	c.flags = FLAG_ASYNC;
	CHECK((rc = call(fd, &c)) == -EINVAL, "async call with an Out buffer -> EINVAL (%d)", rc);

	/* Bad buffer addresses: bounce (small) and pinned (large) paths, both directions. */
	echo_call(&c, (void *)16, big_ok, sizeof small);
	CHECK((rc = call(fd, &c)) == -EFAULT, "small In buffer at 0x10 -> EFAULT (%d)", rc);
	size_t large = 1 << 20;
	unsigned char *lin = mmap(NULL, large, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *lout = mmap(NULL, large, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(lin, 1, large);
	echo_call(&c, (void *)0x1000, lout, large);
	CHECK((rc = call(fd, &c)) == -EFAULT, "large In buffer at 0x1000 -> EFAULT (%d)", rc);
	echo_call(&c, lin, (void *)0xffff800000000000ull, large);
	CHECK((rc = call(fd, &c)) == -EFAULT, "large Out buffer at a kernel address -> EFAULT (%d)", rc);
	echo_call(&c, (void *)(uintptr_t)(~0ull - 100), lout, large);
	CHECK((rc = call(fd, &c)) == -EFAULT, "In buffer wrapping the address space -> EFAULT (%d)", rc);
	unsigned char *ro = mmap(NULL, large, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	echo_call(&c, lin, ro, large);
	CHECK((rc = call(fd, &c)) == -EFAULT, "large Out buffer read-only -> EFAULT (%d)", rc);
	echo_call(&c, small, ro, sizeof small);
	CHECK((rc = call(fd, &c)) == -EFAULT, "small Out buffer read-only -> EFAULT (%d)", rc);
	/* Half mapped: the pin covers part of it, then fails. */
	unsigned char *half = mmap(NULL, large, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(half + large / 2, large / 2);
	echo_call(&c, lin, half, large);
	CHECK((rc = call(fd, &c)) == -EFAULT, "large Out buffer half unmapped -> EFAULT (%d)", rc);
	/* The descriptor table itself may be anywhere readable, e.g. read-only memory. */
	struct qcuda_call *roc = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	hello_call(roc);
	mprotect(roc, 4096, PROT_READ);
	rc = ioctl(fd, QCUDA_IOCTL_CALL, roc) == 0 ? 0 : -errno;
	CHECK(rc == -EFAULT, "read-only argument: executes, then write-back -> EFAULT (%d)", rc);

	/* Zero-length buffers are legal. */
	echo_call(&c, NULL, NULL, 0);
	rc = call(fd, &c);
	CHECK(rc == 0 && c.status == 0, "echo of 0 bytes at NULL: rc %d status %u", rc, c.status);
	/* And the device still works after all that. */
	hello_call(&c);
	CHECK((rc = call(fd, &c)) == 0 && c.status == 0, "hello after bad calls: rc %d", rc);
	close(fd);
}

static void test_echo(void)
{
	int fd = open_dev();
	static const size_t sizes[] = { 1, 7, 100, 4095, 4096, 4097, 65535, 65536, 65537, 200000,
					1 << 20, (1 << 20) + 3, 8 << 20, 64 << 20 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		for (size_t skew = 0; skew < 2; skew++) {
			size_t off = skew ? 4093 : 0;
			double secs = 0;
			int rc = echo_once(fd, sizes[i], off, (unsigned)(i * 2 + skew), &secs);
			/* Worst case: every page of the in and the out buffer its own run, plus header and
			 * response. Only then may the module refuse with E2BIG. */
			size_t pages = (off % 4096 + sizes[i] + 4095) / 4096;
			if (rc == -E2BIG && 2 * pages + 2 > 4096) {
				CHECK(1, "echo %zu bytes at page offset %zu: E2BIG (pages too scattered)", sizes[i],
				      off % 4096);
				continue;
			}
			CHECK(rc == 0, "echo %zu bytes at page offset %zu: rc %d, %.3f s, %.1f MiB/s", sizes[i],
			      off % 4096, rc, secs, sizes[i] / secs / 1048576.0);
		}
	}
	close(fd);
}

/*
 * A 64 MiB buffer whose pages are physically scattered (two buffers faulted in alternately),
 * so that it needs ~16k descriptors, more than MAX_CHAIN_SEGMENTS: the module refuses it with
 * E2BIG before anything reaches the device.
 */
static void test_e2big(void)
{
	int fd = open_dev();
	size_t len = 64 << 20, pages = len / 4096;
	unsigned char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	madvise(a, len, MADV_NOHUGEPAGE);
	madvise(b, len, MADV_NOHUGEPAGE);
	for (size_t i = 0; i < pages; i++) {
		a[i * 4096] = 1;
		b[i * 4096] = 2;
	}
	struct qcuda_call c;
	echo_call(&c, a, b, len);
	int rc = call(fd, &c);
	CHECK(rc == -E2BIG || (rc == 0 && c.status == 0),
	      "64 MiB scattered echo -> E2BIG or success (%d%s)", rc,
	      rc == 0 ? ": pages happened to be contiguous" : "");
	hello_call(&c);
	CHECK((rc = call(fd, &c)) == 0, "hello after E2BIG: rc %d", rc);
	munmap(a, len);
	munmap(b, len);
	close(fd);
}

struct worker_arg {
	int fd;
	int id;
	int calls;
	int errors;
};

static void *echo_worker(void *p)
{
	struct worker_arg *w = p;
	for (int i = 0; i < w->calls; i++) {
		size_t len = (i % 3 == 0) ? 300000 + i : 1000 + 37 * i;
		if (echo_once(w->fd, len, (size_t)(i * 13) % 4096, (unsigned)(w->id * 1000 + i), NULL))
			w->errors++;
	}
	return NULL;
}

/* 4 processes x 4 threads, all with calls in flight on shared and private files. */
static void test_concurrency(void)
{
	enum { PROCS = 4, THREADS = 4, CALLS = 12 };
	double t0 = now();
	pid_t pids[PROCS];
	for (int p = 0; p < PROCS; p++) {
		pids[p] = fork();
		if (pids[p] == 0) {
			int fd = open_dev();
			pthread_t t[THREADS];
			struct worker_arg w[THREADS];
			for (int i = 0; i < THREADS; i++) {
				w[i] = (struct worker_arg){ fd, p * THREADS + i, CALLS, 0 };
				pthread_create(&t[i], NULL, echo_worker, &w[i]);
			}
			int errors = 0;
			for (int i = 0; i < THREADS; i++) {
				pthread_join(t[i], NULL);
				errors += w[i].errors;
			}
			_exit(errors ? 1 : 0);
		}
	}
	int bad = 0;
	for (int p = 0; p < PROCS; p++) {
		int st;
		waitpid(pids[p], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
	}
	CHECK(bad == 0, "concurrency: %d processes x %d threads x %d echo calls, %d processes failed, %.1f s",
	      PROCS, THREADS, CALLS, bad, now() - t0);
}

/*
 * Every request the device held has completed and been freed: calls reap, so issue hellos
 * until the in-flight table is empty again (abandoned chains complete on their own). The table
 * is the device's: the caller makes sure no other program is calling.
 */
static void check_drained(int fd, const char *after)
{
	struct qcuda_call c;
	long ring = -1, abandoned = -1, reapable = -1, free_slots = -1;
	for (int i = 0; i < 100; i++) {
		hello_call(&c);
		call(fd, &c);
		ring = fdinfo(fd, "qcuda-in-ring");
		abandoned = fdinfo(fd, "qcuda-abandoned");
		reapable = fdinfo(fd, "qcuda-reapable");
		free_slots = fdinfo(fd, "qcuda-free-slots");
		/* A slot neither free nor in the ring holds a completion its caller has not yet
		 * collected (a waiter about to run): wait for that too. */
		if (ring == 0 && abandoned == 0 && reapable == 0 && free_slots == 256)
			break;
		usleep(50000);
	}
	CHECK(ring == 0 && abandoned == 0 && reapable == 0 && free_slots == 256,
	      "after %s: in-ring %ld, abandoned %ld, reapable %ld, free slots %ld", after, ring, abandoned,
	      reapable, free_slots);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* Signals interrupt waits: EINTR before the request is queued, EINPROGRESS after (it runs,
 * its answer is dropped), no corruption, and the device keeps working. */
static void test_signals(void)
{
	struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART */
	sigaction(SIGALRM, &sa, NULL);
	int fd = open_dev();
	struct itimerval it = { { 0, 2000 }, { 0, 2000 } };
	setitimer(ITIMER_REAL, &it, NULL);
	int ok = 0, eintr = 0, inprogress = 0, other = 0;
	double t0 = now();
	while (now() - t0 < 5.0) {
		unsigned n = (unsigned)(ok + eintr + inprogress);
		size_t len = n % 2 ? 2 << 20 : 5000;
		int rc = echo_once(fd, len, 0, n, NULL);
		if (rc == 0)
			ok++;
		else if (rc == -EINTR)
			eintr++;
		else if (rc == -EINPROGRESS)
			inprogress++;
		else
			other++;
	}
	struct itimerval off = { 0 };
	setitimer(ITIMER_REAL, &off, NULL);
	CHECK(other == 0 && ok > 0 && inprogress > 0,
	      "signals: %d calls completed, %d interrupted before queueing (EINTR), %d after (EINPROGRESS), "
	      "%d other errors",
	      ok, eintr, inprogress, other);
	/* Interrupted requests are freed when they complete; the queue is intact. */
	int rc = echo_once(fd, 1 << 20, 0, 7, NULL);
	CHECK(rc == 0, "echo after interrupted calls: rc %d", rc);
	check_drained(fd, "interrupted calls");
	close(fd);
}

/* Processes killed mid-call: their files close (SessionClose), nothing hangs or leaks. */
static void test_kill(void)
{
	enum { ROUNDS = 20 };
	double t0 = now();
	int killed = 0;
	for (int r = 0; r < ROUNDS; r++) {
		pid_t pid = fork();
		if (pid == 0) {
			int fd = open_dev();
			for (unsigned i = 0;; i++)
				echo_once(fd, i % 2 ? 4 << 20 : 3000, 0, i, NULL);
		}
		usleep(20000 + (r % 5) * 10000);
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		killed += WIFSIGNALED(st);
	}
	CHECK(killed == ROUNDS, "kill: %d of %d processes killed mid-call and reaped, %.1f s", killed, ROUNDS,
	      now() - t0);
	int fd = open_dev();
	struct qcuda_call c;
	hello_call(&c);
	int rc = call(fd, &c);
	CHECK(rc == 0 && c.status == 0 && c.rets[3] == 1, "hello after kills: rc %d, host sessions %llu (want 1)",
	      rc, (unsigned long long)c.rets[3]);
	check_drained(fd, "killed processes");
	close(fd);
}

static int flood_fd = -1;

static void on_flood_watchdog(int sig)
{
	(void)sig;
	static const char msg[] = "FAIL flood: stuck for 60 s (a full ring that nobody frees); the file's state:\n";
	write(1, msg, sizeof msg - 1);
	/* open, read and write are async-signal-safe: show what qcuda.ko says of the ring. */
	char path[64] = "/proc/self/fdinfo/";
	int n = 18;
	for (int v = flood_fd, d = 1000; d > 0; d /= 10)
		if (v >= d || d == 1 || n > 18)
			path[n++] = (char)('0' + (v / d) % 10);
	path[n] = 0;
	int f = open(path, O_RDONLY);
	char buf[1024];
	ssize_t r = f >= 0 ? read(f, buf, sizeof buf) : -1;
	if (r > 0)
		write(1, buf, (size_t)r);
	_exit(1);
}

/*
 * `flood`: fire-and-forget calls without any waited-for call in between, for 8 s, while the host
 * stalls the daemon for a while (scripts/test.sh sends it SIGSTOP after "FLOOD-START", then
 * SIGCONT). Each flooding thread has its own file (a session of its own), and no file may ever
 * have more than the module's per-session bound (64) in the ring. Two flood from the start, and
 * the first must reach the bound and stop there while the host holds its requests; then four
 * more start, and together they fill the ring (256 slots), so callers sleep for a slot and must
 * get one once the host goes on. A watchdog fails the test if it hangs.
 */
#define FLOOD_BOUND 64
#define FLOOD_EARLY 2
#define FLOOD_THREADS 6
struct flood_arg {
	int fd;
	volatile int go, stop;
	long n;
	int rc;
	double slowest;
};

static void *flood_worker(void *p)
{
	struct flood_arg *a = p;
	while (!a->go)
		usleep(1000);
	struct qcuda_call c;
	while (!a->stop) {
		hello_call(&c);
		c.flags = FLAG_ASYNC;
		double t = now();
		if ((a->rc = call(a->fd, &c)) != 0)
			break;
		if (now() - t > a->slowest)
			a->slowest = now() - t;
		a->n++;
	}
	return NULL;
}

static void test_flood(void)
{
	signal(SIGALRM, on_flood_watchdog);
	alarm(60);
	struct flood_arg a[FLOOD_THREADS];
	pthread_t t[FLOOD_THREADS];
	for (int i = 0; i < FLOOD_THREADS; i++) {
		a[i] = (struct flood_arg){ .fd = open_dev(), .go = i < FLOOD_EARLY };
		pthread_create(&t[i], NULL, flood_worker, &a[i]);
	}
	flood_fd = a[0].fd;
	printf("FLOOD-START\n");
	/* Watch each file's requests in the ring (fdinfo), and the device's free slots. */
	long most[FLOOD_THREADS] = { 0 }, fewest_free = 256;
	double t0 = now(), bound_at = -1;
	while (now() - t0 < 8.0) {
		for (int i = 0; i < FLOOD_THREADS; i++) {
			long v = fdinfo(a[i].fd, "qcuda-posted");
			if (v > most[i])
				most[i] = v;
		}
		long f = fdinfo(a[0].fd, "qcuda-free-slots");
		if (f >= 0 && f < fewest_free)
			fewest_free = f;
		if (bound_at < 0 && most[0] >= FLOOD_BOUND) {
			bound_at = now() - t0;
			for (int i = FLOOD_EARLY; i < FLOOD_THREADS; i++)
				a[i].go = 1;
		}
		usleep(2000);
	}
	long total = 0, above = 0;
	double slowest = 0;
	int rc = 0;
	for (int i = 0; i < FLOOD_THREADS; i++) {
		a[i].go = a[i].stop = 1;
		pthread_join(t[i], NULL);
		total += a[i].n;
		rc = rc ? rc : a[i].rc;
		slowest = a[i].slowest > slowest ? a[i].slowest : slowest;
		above += most[i] > FLOOD_BOUND;

	}
	alarm(0);
	CHECK(rc == 0 && total > 256, "flood: %ld fire-and-forget calls from %d files in 8 s, slowest %.0f ms (rc %d)",
	      total, FLOOD_THREADS, slowest * 1e3, rc);
	CHECK(most[0] == FLOOD_BOUND && above == 0,
	      "flood: a held session stops at %d requests in the ring (most per file: %ld %ld %ld %ld %ld %ld; at %.1f s)",
	      FLOOD_BOUND, most[0], most[1], most[2], most[3], most[4], most[5], bound_at);
	CHECK(fewest_free == 0, "flood: more sessions fill the ring (fewest free slots seen: %ld)", fewest_free);
	struct qcuda_call c;
	hello_call(&c);
	rc = call(a[0].fd, &c);
	CHECK(rc == 0 && c.status == 0, "waited call after the flood: rc %d", rc);
	for (int i = 1; i < FLOOD_THREADS; i++)
		close(a[i].fd);
	check_drained(a[0].fd, "the flood");
	close(a[0].fd);
}

/*
 * `unplug`: keeps 4 threads calling until the device goes away (the caller unbinds it), then
 * checks that every call failed cleanly with ENODEV and that the session still closes.
 */
struct unplug_arg {
	int fd;
	int id;
	long ok, enodev, other;
};

/*
 * Host-mapped memory, without caring whether the host has a GPU: an mmap of /dev/qcuda gives
 * zeroed, writable pages the module holds (fdinfo counts them); IOCTL_HOST_MAP of it and of a
 * malloc'd buffer get a host status (success with a GPU, an error without), bad arguments get
 * errnos, and every page is released once unmapped or refused, and at close.
 */
static void test_host_memory(void)
{
	int fd = open_dev();
	const size_t len = 8u << 20;
	unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED, "mmap of 8 MiB: %s", p == MAP_FAILED ? strerror(errno) : "ok");
	if (p == MAP_FAILED) {
		close(fd);
		return;
	}
	int zero = 1;
	for (size_t i = 0; i < len; i += 4093)
		zero &= p[i] == 0;
	CHECK(zero, "mmapped pages are zeroed");
	memset(p, 0x5a, len);
	CHECK(fdinfo(fd, "qcuda-host-pages") == (long)(len / 4096), "module holds %ld pages for the mmap",
	      fdinfo(fd, "qcuda-host-pages"));
	CHECK(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 4096) == MAP_FAILED && errno == EINVAL,
	      "mmap at a non-zero offset: EINVAL");

	struct qcuda_host_map m = { .addr = (uintptr_t)p, .len = len };
	int rc = ioctl(fd, QCUDA_IOCTL_HOST_MAP, &m);
	int mapped = rc == 0 && m.status == 0;
	CHECK(rc == 0, "HOST_MAP of the mmap: rc %d errno %d, host status %u, device address %#llx", rc,
	      rc ? errno : 0, m.status, (unsigned long long)m.dev_addr);
	if (mapped)
		CHECK(m.dev_addr != 0, "a mapped range has a device address");
	struct qcuda_host_map again = { .addr = (uintptr_t)p, .len = len };
	if (mapped) {
		rc = ioctl(fd, QCUDA_IOCTL_HOST_MAP, &again);
		CHECK(rc == 0 && again.status == 712, "mapping it twice: status %u", again.status);
	}
	struct qcuda_host_map bad = { .addr = (uintptr_t)p, .len = 0 };
	CHECK(ioctl(fd, QCUDA_IOCTL_HOST_MAP, &bad) < 0 && errno == EINVAL, "zero length: EINVAL");
	/* 1 and 2 are HOST_MAP_READ_ONLY and HOST_MAP_MANAGED; the next bit is unknown. */
	bad = (struct qcuda_host_map){ .addr = (uintptr_t)p, .len = 4096, .flags = 4 };
	CHECK(ioctl(fd, QCUDA_IOCTL_HOST_MAP, &bad) < 0 && errno == EINVAL, "unknown flag: EINVAL");
	bad = (struct qcuda_host_map){ .addr = 0x10, .len = 4096 };
	CHECK(ioctl(fd, QCUDA_IOCTL_HOST_MAP, &bad) < 0 && errno == EFAULT, "unmapped user range: EFAULT");
	bad = (struct qcuda_host_map){ .addr = 0x1000 };
	rc = ioctl(fd, QCUDA_IOCTL_HOST_UNMAP, &bad);
	CHECK(rc == 0 && bad.status == HOST_MEMORY_NOT_REGISTERED, "unmapping nothing: status %u",
	      bad.status);

	/* A malloc'd, unaligned buffer: pinned while mapped, released when refused or unmapped. */
	unsigned char *b = malloc(3u << 20);
	memset(b, 1, 3u << 20);
	struct qcuda_host_map r = { .addr = (uintptr_t)(b + 100), .len = (3u << 20) - 200 };
	rc = ioctl(fd, QCUDA_IOCTL_HOST_MAP, &r);
	CHECK(rc == 0, "HOST_MAP of malloc memory: rc %d, status %u", rc, r.status);
	long held = fdinfo(fd, "qcuda-host-pages");
	if (rc == 0 && r.status == 0) {
		CHECK(held > (long)(len / 4096), "pinned pages counted: %ld", held);
		r.len = 0;
		rc = ioctl(fd, QCUDA_IOCTL_HOST_UNMAP, &r);
		CHECK(rc == 0 && r.status == 0, "HOST_UNMAP of malloc memory: status %u", r.status);
	}
	CHECK(fdinfo(fd, "qcuda-host-pages") == (long)(len / 4096),
	      "pinned pages released: %ld held (the mmap's only)", fdinfo(fd, "qcuda-host-pages"));
	free(b);

	m.len = 0;
	rc = ioctl(fd, QCUDA_IOCTL_HOST_UNMAP, &m);
	CHECK(rc == 0 && (m.status == 0 || !mapped), "HOST_UNMAP of the mmap: status %u", m.status);
	CHECK(fdinfo(fd, "qcuda-host-pages") == 0, "module released the mmap's pages: %ld held",
	      fdinfo(fd, "qcuda-host-pages"));
	int intact = 1;
	for (size_t i = 0; i < len; i += 4093)
		intact &= p[i] == 0x5a;
	CHECK(intact, "the mapping stays readable until munmap (its own page references)");
	munmap(p, len);

	/* Closing a file with mapped memory releases everything. */
	int fd2 = open_dev();
	unsigned char *q = mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
	struct qcuda_host_map m2 = { .addr = (uintptr_t)q, .len = 1u << 20 };
	rc = q == MAP_FAILED ? -1 : ioctl(fd2, QCUDA_IOCTL_HOST_MAP, &m2);
	CHECK(rc == 0, "HOST_MAP on a second file: status %u", m2.status);
	if (q != MAP_FAILED)
		munmap(q, 1u << 20);
	close(fd2);
	CHECK(fdinfo(fd, "qcuda-host-pages-all") == 0, "nothing held after close: %ld",
	      fdinfo(fd, "qcuda-host-pages-all"));
	close(fd);
}

static void *unplug_worker(void *p)
{
	struct unplug_arg *u = p;
	for (unsigned i = 0;; i++) {
		int rc = echo_once(u->fd, i % 2 ? 3 << 20 : 2000, 0, (unsigned)u->id + i, NULL);
		if (rc == 0)
			u->ok++;
		else if (rc == -ENODEV) {
			u->enodev++;
			if (u->enodev > 3)
				return NULL;
		} else
			u->other++;
	}
}

static void test_unplug(void)
{
	enum { THREADS = 4 };
	int fd = open_dev();
	pthread_t t[THREADS];
	struct unplug_arg u[THREADS];
	for (int i = 0; i < THREADS; i++) {
		u[i] = (struct unplug_arg){ fd, i * 1000, 0, 0, 0 };
		pthread_create(&t[i], NULL, unplug_worker, &u[i]);
	}
	long ok = 0, enodev = 0, other = 0;
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		ok += u[i].ok;
		enodev += u[i].enodev;
		other += u[i].other;
	}
	CHECK(ok > 0 && enodev == 4 * THREADS && other == 0,
	      "unplug: %ld calls completed before removal, %ld ENODEV after, %ld other errors", ok, enodev, other);
	struct qcuda_call c;
	hello_call(&c);
	int rc = call(fd, &c);
	CHECK(rc == -ENODEV, "call on a file of a removed device -> ENODEV (%d)", rc);
	CHECK(close(fd) == 0, "close of a file of a removed device");
}

/* ProcessCheckpoint from `fd` about process `pid`: the call's status, the answer in *ret. */
static uint32_t process_call(int fd, uint64_t action, int pid, uint64_t timeout_ms, uint64_t *ret)
{
	struct qcuda_call c;
	memset(&c, 0, sizeof c);
	c.op = OP_PROCESS_CHECKPOINT;
	c.args[0] = action;
	c.args[1] = (uint64_t)pid;
	c.args[2] = timeout_ms;
	c.args[3] = 12345; /* a session of the caller's choosing: the module overwrites it */
	int rc = call(fd, &c);
	if (rc != 0)
		return 0xffffffffu;
	if (ret)
		*ret = c.rets[0];
	return c.status;
}

/*
 * CUDA's process checkpoint through the module (issue 31): a child with a session is named by
 * pid; its calls wait while it is locked and go on after the unlock; states and errors as CUDA
 * documents them; a process without a session, a missing pid and another user are refused.
 */
static void test_process(void)
{
	int to_child[2], from_child[2];
	if (pipe(to_child) || pipe(from_child)) {
		CHECK(0, "process: pipes");
		return;
	}
	pid_t child = fork();
	if (child == 0) {
		/* Only the parent writes to_child: its close is the child's end. */
		close(to_child[1]);
		close(from_child[0]);
		int fd = open_dev();
		struct qcuda_call c;
		char b;
		/* One call makes the session known to the host; then a call per byte from the parent. */
		hello_call(&c);
		int rc = call(fd, &c);
		b = rc == 0 ? 'r' : 'x';
		if (write(from_child[1], &b, 1) != 1)
			_exit(1);
		while (read(to_child[0], &b, 1) == 1 && b == 'c') {
			hello_call(&c);
			rc = call(fd, &c);
			b = rc == 0 && c.status == 0 ? 'd' : 'x';
			if (write(from_child[1], &b, 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	close(to_child[0]);
	close(from_child[1]);
	int fd = open_dev();
	char b = 0;
	uint64_t v = 99;
	CHECK(read(from_child[0], &b, 1) == 1 && b == 'r', "process: the child made a call");
	uint32_t st = process_call(fd, P_GET_STATE, child, 0, &v);
	CHECK(st == 0 && v == S_RUNNING, "process: a running process is RUNNING (%u, %llu)", st,
	      (unsigned long long)v);
	CHECK(process_call(fd, P_UNLOCK, child, 0, NULL) == ILLEGAL_STATE, "process: unlock of a running process is refused");
	CHECK(process_call(fd, P_LOCK, child, 1000, NULL) == 0, "process: lock");
	CHECK(process_call(fd, P_LOCK, child, 0, NULL) == ILLEGAL_STATE, "process: a second lock is refused");
	/* The locked child's next call waits. */
	b = 'c';
	CHECK(write(to_child[1], &b, 1) == 1, "process: the child calls while locked");
	struct timeval tv = { 0, 400000 };
	fd_set set;
	FD_ZERO(&set);
	FD_SET(from_child[0], &set);
	CHECK(select(from_child[0] + 1, &set, NULL, NULL, &tv) == 0, "process: the locked child's call waits");
	CHECK(process_call(fd, P_CHECKPOINT, child, 0, NULL) == 0, "process: checkpoint");
	st = process_call(fd, P_GET_STATE, child, 0, &v);
	CHECK(st == 0 && v == S_CHECKPOINTED, "process: CHECKPOINTED (%u, %llu)", st, (unsigned long long)v);
	CHECK(process_call(fd, P_UNLOCK, child, 0, NULL) == ILLEGAL_STATE, "process: unlock of a checkpointed process is refused");
	CHECK(process_call(fd, P_RESTORE, child, 0, NULL) == 0, "process: restore");
	CHECK(process_call(fd, P_UNLOCK, child, 0, NULL) == 0, "process: unlock");
	CHECK(read(from_child[0], &b, 1) == 1 && b == 'd', "process: the child's call went on after the unlock");
	st = process_call(fd, P_RESTORE_THREAD, child, 0, &v);
	CHECK(st == 0 && v == (uint64_t)child, "process: restore thread (%u, %llu)", st, (unsigned long long)v);
	st = process_call(fd, P_GET_STATE, 1, 0, &v);
	CHECK(st == INITIALIZATION_ERROR, "process: a process without a session -> INITIALIZATION_ERROR (%u)", st);
	st = process_call(fd, P_GET_STATE, 0x3ffffff0, 0, &v);
	CHECK(st == INVALID_VALUE, "process: no such pid -> INVALID_VALUE (%u)", st);
	if (getuid() == 0) {
		chmod(dev_path, 0666);
		pid_t other = fork();
		if (other == 0) {
			if (setgid(65534) || setuid(65534))
				_exit(3);
			int ofd = open(dev_path, O_RDWR | O_CLOEXEC);
			if (ofd < 0)
				_exit(4);
			_exit(process_call(ofd, P_LOCK, child, 0, NULL) == NOT_PERMITTED ? 0 : 5);
		}
		int status = 0;
		waitpid(other, &status, 0);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process: another user may not lock it (%d)",
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		st = process_call(fd, P_GET_STATE, child, 0, &v);
		CHECK(st == 0 && v == S_RUNNING, "process: still RUNNING");
	}
	close(to_child[1]);
	int status = 0;
	waitpid(child, &status, 0);
	st = process_call(fd, P_LOCK, child, 0, NULL);
	CHECK(st == INVALID_VALUE || st == INITIALIZATION_ERROR, "process: an ended process cannot be locked (%u)", st);
	close(fd);
	close(from_child[0]);
}

/* A GpuTrace status request about process `pid` (its recorder's state). */
static uint32_t trace_call(int fd, int pid)
{
	struct qcuda_call c;
	static uint8_t out[64];
	memset(&c, 0, sizeof c);
	c.op = OP_GPU_TRACE;
	c.nbufs = 1;
	c.args[0] = 0; /* TRACE_STATUS */
	c.args[1] = (uint64_t)pid;
	c.args[3] = 12345; /* a session of the caller's choosing: the module overwrites it */
	c.bufs[0] = (struct qcuda_buffer){ (uintptr_t)out, sizeof out, DIR_OUT, 0 };
	int rc = call(fd, &c);
	return rc != 0 ? 0xffffffffu : c.status;
}

/*
 * A process's GPU timeline (issue 38), named by pid as for the process checkpoint: a child with
 * a session but no GPU work yet is found (nothing to record: NOT_READY), a process without a
 * session, a missing pid and another user are refused.
 */
static void test_trace(void)
{
	int to_child[2], from_child[2];
	if (pipe(to_child) || pipe(from_child)) {
		CHECK(0, "trace: pipes");
		return;
	}
	pid_t child = fork();
	if (child == 0) {
		close(to_child[1]);
		close(from_child[0]);
		int fd = open_dev();
		struct qcuda_call c;
		char b;
		hello_call(&c);
		b = call(fd, &c) == 0 ? 'r' : 'x';
		if (write(from_child[1], &b, 1) != 1)
			_exit(1);
		/* Until the parent closes its end. */
		while (read(to_child[0], &b, 1) == 1) {
		}
		_exit(0);
	}
	close(to_child[0]);
	close(from_child[1]);
	int fd = open_dev();
	char b = 0;
	CHECK(read(from_child[0], &b, 1) == 1 && b == 'r', "trace: the child made a call");
	uint32_t st = trace_call(fd, child);
	CHECK(st == NOT_READY, "trace: a process without GPU work is found, nothing to record (%u)", st);
	st = trace_call(fd, 1);
	CHECK(st == INITIALIZATION_ERROR, "trace: a process without a session -> INITIALIZATION_ERROR (%u)", st);
	st = trace_call(fd, 0x3ffffff0);
	CHECK(st == INVALID_VALUE, "trace: no such pid -> INVALID_VALUE (%u)", st);
	if (getuid() == 0) {
		chmod(dev_path, 0666);
		pid_t other = fork();
		if (other == 0) {
			if (setgid(65534) || setuid(65534))
				_exit(3);
			int ofd = open(dev_path, O_RDWR | O_CLOEXEC);
			if (ofd < 0)
				_exit(4);
			_exit(trace_call(ofd, child) == NOT_PERMITTED ? 0 : 5);
		}
		int status = 0;
		waitpid(other, &status, 0);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "trace: another user may not trace it (%d)",
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	}
	close(to_child[1]);
	int status = 0;
	waitpid(child, &status, 0);
	close(fd);
	close(from_child[0]);
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "all";
	int all = !strcmp(what, "all");
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (all || !strcmp(what, "basic"))
		test_basic();
	if (all || !strcmp(what, "validate"))
		test_validate();
	if (all || !strcmp(what, "echo"))
		test_echo();
	if (all || !strcmp(what, "e2big"))
		test_e2big();
	if (all || !strcmp(what, "concurrency"))
		test_concurrency();
	if (all || !strcmp(what, "signals"))
		test_signals();
	if (all || !strcmp(what, "kill"))
		test_kill();
	if (all || !strcmp(what, "host-memory"))
		test_host_memory();
	if (all || !strcmp(what, "process"))
		test_process();
	if (all || !strcmp(what, "trace"))
		test_trace();
	if (!strcmp(what, "unplug")) /* not in "all": the caller must remove the device */
		test_unplug();
	if (!strcmp(what, "flood")) /* not in "all": the caller stalls the daemon meanwhile */
		test_flood();
	printf("qcuda-transport-test: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
