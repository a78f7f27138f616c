// SPDX-License-Identifier: Apache-2.0 OR MIT
// Guest smoke test: a dynamically linked glibc program with threads, C++ runtime-style
// features (TLS, mmap, futex-based joins, /proc/self/exe, clock_gettime, eventfd, epoll)
// must run in the guest initramfs. Built on the Debian 12 host by scripts/build-guest.sh's
// callers (cc -O2 -pthread); exit code 0 means everything worked.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define THREADS 8
static _Thread_local int tls_value;
static atomic_long total;

static void *worker(void *arg)
{
	long id = (long)arg;
	tls_value = (int)id;
	size_t len = 1 << 20;
	unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return (void *)1;
	memset(p, (int)id, len);
	long sum = 0;
	for (size_t i = 0; i < len; i += 4096)
		sum += p[i];
	munmap(p, len);
	atomic_fetch_add(&total, sum);
	return tls_value == id ? NULL : (void *)1;
}

int main(void)
{
	pthread_t t[THREADS];
	for (long i = 0; i < THREADS; i++)
		if (pthread_create(&t[i], NULL, worker, (void *)i)) {
			perror("pthread_create");
			return 1;
		}
	for (int i = 0; i < THREADS; i++) {
		void *r;
		pthread_join(t[i], &r);
		if (r) {
			fprintf(stderr, "thread %d failed\n", i);
			return 1;
		}
	}
	long want = 0;
	for (long i = 0; i < THREADS; i++)
		want += i * 256;
	char exe[256];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n < 0) {
		perror("readlink /proc/self/exe");
		return 1;
	}
	exe[n] = 0;
	int efd = eventfd(0, 0), ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN }, out;
	uint64_t one = 1;
	if (efd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) ||
	    write(efd, &one, 8) != 8 || epoll_wait(ep, &out, 1, 1000) != 1) {
		perror("eventfd/epoll");
		return 1;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	printf("pthread-smoke: %d threads ok, sum %ld (want %ld), exe %s, cpus %ld\n", THREADS,
	       (long)total, want, exe, sysconf(_SC_NPROCESSORS_ONLN));
	return total == want ? 0 : 1;
}
