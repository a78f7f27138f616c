// SPDX-License-Identifier: Apache-2.0 OR MIT
/*
 * kvm-probe: what does this host's /dev/kvm offer a PVM guest?
 *
 * Build and run (root, or a member of group kvm):
 *     gcc -O2 -Wall -o kvm-probe scripts/kvm-probe.c && ./kvm-probe
 *
 * It reports, without booting any kernel:
 *   1. the hypervisor CPUID leaves (0x40000000-0x400002ff) in
 *      KVM_GET_SUPPORTED_CPUID and KVM_GET_EMULATED_CPUID;
 *   2. the MSRs of KVM_GET_MSR_INDEX_LIST in the paravirtual block
 *      0x4b564d00-0x4b564dff;
 *   3. whether a vCPU accepts KVM_GET_MSRS / KVM_SET_MSRS for the MSRs of the
 *      two public PVM guest ABIs: virt-pvm (0x4b564df0-0x4b564df6) and
 *      aledbf's "ABI v1" (0x4b564d20-0x4b564d23);
 *   4. what a PVM guest kernel's early detection would see. A vCPU is put
 *      straight into 64-bit mode (CS DPL 0, L=1, paging on, IF=1), the way
 *      the PVM test harnesses hand a guest to the hypervisor, and runs a few
 *      hand-assembled instructions that report through port I/O:
 *        - the hardware CS selector (RPL 3 means the guest kernel runs at
 *          hardware CPL 3, which is what every PVM guest's pvm_detect()
 *          checks first) and RFLAGS (IF must be 1);
 *        - the PVM "synthetic CPUID" (INVLPG of 0xffffffffff4d5650, then
 *          CPUID) for leaves 0x40000000, 0x40000001, 0x40000002 (virt-pvm's
 *          vendor leaf, EBX 0x4d5650 "PVM"), 0x40000200 and 0x40000201
 *          (aledbf's "PVMPVMPVM" signature and ABI version);
 *        - a plain CPUID 0x40000000;
 *        - optionally (argument: an MSR number in hex) an RDMSR of that MSR
 *          from inside the guest, last, since it may fault.
 *      With "-l N" the guest first spins N iterations of dec/jnz, and the
 *      run is timed: emulated instructions cost microseconds, native ones
 *      a nanosecond or less. With "-u" the vCPU starts in 64-bit user mode
 *      (CS 0x33, DPL 3, IOPL 3 so that port I/O still reports) instead.
 *
 * A guest that faults has no IDT, so a fault shows as the exit that ends
 * the run (SHUTDOWN, INTERNAL_ERROR, ...), printed with the vCPU's RIP.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MEM_SIZE (4UL << 20)
#define PML4 0x1000
#define PDPT 0x2000
#define PD 0x3000
#define CODE 0x10000
#define STACK 0x20000

static int kvm, vm, vcpu;
static struct kvm_run *run;
static uint8_t *mem;
static int user_mode;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static const char *exit_name(unsigned r)
{
	static const char *n[] = {
		[KVM_EXIT_UNKNOWN] = "UNKNOWN", [KVM_EXIT_EXCEPTION] = "EXCEPTION",
		[KVM_EXIT_IO] = "IO", [KVM_EXIT_HYPERCALL] = "HYPERCALL",
		[KVM_EXIT_DEBUG] = "DEBUG", [KVM_EXIT_HLT] = "HLT",
		[KVM_EXIT_MMIO] = "MMIO", [KVM_EXIT_SHUTDOWN] = "SHUTDOWN",
		[KVM_EXIT_FAIL_ENTRY] = "FAIL_ENTRY", [KVM_EXIT_INTR] = "INTR",
		[KVM_EXIT_INTERNAL_ERROR] = "INTERNAL_ERROR",
	};
	return r < sizeof(n) / sizeof(n[0]) && n[r] ? n[r] : "other";
}

static void sig4(char out[17], uint32_t b, uint32_t c, uint32_t d)
{
	uint32_t r[3] = { b, c, d };

	memcpy(out, r, 12);
	for (int i = 0; i < 12; i++)
		if (out[i] < 0x20 || out[i] > 0x7e)
			out[i] = '.';
	out[12] = 0;
}

static void dump_cpuid(unsigned long ioc, const char *name)
{
	int n = 512;
	struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + n * sizeof(c->entries[0]));

	c->nent = n;
	if (ioctl(kvm, ioc, c) < 0) {
		printf("%s: %s\n", name, strerror(errno));
		return;
	}
	printf("%s: %u entries; hypervisor leaves:\n", name, c->nent);
	int any = 0;
	for (unsigned i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];
		char s[17];

		if (e->function < 0x40000000 || e->function > 0x400002ff)
			continue;
		any = 1;
		sig4(s, e->ebx, e->ecx, e->edx);
		printf("  %#010x.%u: eax=%#010x ebx=%#010x ecx=%#010x edx=%#010x  \"%s\"\n",
		       e->function, e->index, e->eax, e->ebx, e->ecx, e->edx, s);
	}
	if (!any)
		printf("  (none)\n");
	free(c);
}

static void dump_msr_list(void)
{
	struct kvm_msr_list probe = { .nmsrs = 0 }, *l;

	ioctl(kvm, KVM_GET_MSR_INDEX_LIST, &probe); /* E2BIG, sets nmsrs */
	l = calloc(1, sizeof(*l) + probe.nmsrs * sizeof(uint32_t));
	l->nmsrs = probe.nmsrs;
	if (ioctl(kvm, KVM_GET_MSR_INDEX_LIST, l) < 0)
		die("KVM_GET_MSR_INDEX_LIST");
	printf("KVM_GET_MSR_INDEX_LIST: %u MSRs; in 0x4b564d00-0x4b564dff:", l->nmsrs);
	for (unsigned i = 0; i < l->nmsrs; i++)
		if ((l->indices[i] & ~0xffu) == 0x4b564d00)
			printf(" %#x", l->indices[i]);
	printf("\n");
	free(l);
}

/* One MSR per call: KVM_GET_MSRS stops at the first one it cannot read. */
static int get_msr(uint32_t idx, uint64_t *val)
{
	struct {
		struct kvm_msrs h;
		struct kvm_msr_entry e;
	} m = { .h.nmsrs = 1, .e.index = idx };
	int r = ioctl(vcpu, KVM_GET_MSRS, &m);

	*val = m.e.data;
	return r;
}

static int set_msr(uint32_t idx, uint64_t val)
{
	struct {
		struct kvm_msrs h;
		struct kvm_msr_entry e;
	} m = { .h.nmsrs = 1, .e.index = idx, .e.data = val };
	return ioctl(vcpu, KVM_SET_MSRS, &m);
}

static void probe_msrs(void)
{
	static const struct {
		uint32_t idx;
		const char *name;
	} msrs[] = {
		{ 0x4b564d01, "KVM system time (control, expected present)" },
		{ 0x4b564df0, "virt-pvm MSR_PVM_LINEAR_ADDRESS_RANGE" },
		{ 0x4b564df1, "virt-pvm MSR_PVM_VCPU_STRUCT" },
		{ 0x4b564df4, "virt-pvm MSR_PVM_EVENT_ENTRY" },
		{ 0x4b564df5, "virt-pvm MSR_PVM_RETU_RIP" },
		{ 0x4b564df6, "virt-pvm MSR_PVM_RETS_RIP" },
		{ 0x4b564d20, "aledbf v1 MSR_PVM_VCPU_STRUCT" },
		{ 0x4b564d21, "aledbf v1 MSR_PVM_EVENT_ENTRY" },
		{ 0x4b564d22, "aledbf v1 MSR_PVM_RETU_RIP" },
		{ 0x4b564d23, "aledbf v1 MSR_PVM_FEATURES_ENABLED" },
	};

	printf("vCPU KVM_GET_MSRS / KVM_SET_MSRS (1 = accepted, 0 = refused):\n");
	for (unsigned i = 0; i < sizeof(msrs) / sizeof(msrs[0]); i++) {
		uint64_t v = 0;
		int g = get_msr(msrs[i].idx, &v);
		/* Write back what was read, so a present MSR is left unchanged. */
		int s = g == 1 ? set_msr(msrs[i].idx, v) : -1;

		printf("  %#x %-45s get=%d", msrs[i].idx, msrs[i].name, g);
		if (g == 1)
			printf(" value=%#llx set=%d", (unsigned long long)v, s);
		printf("\n");
	}
}

/* --- the guest ------------------------------------------------------------ */

static uint8_t *pc;

static void emit(const void *b, size_t n)
{
	memcpy(pc, b, n);
	pc += n;
}
#define EMIT(...)                                      \
	do {                                           \
		const uint8_t _b[] = { __VA_ARGS__ };  \
		emit(_b, sizeof(_b));                  \
	} while (0)

static int nreports;
static const char *labels[64];

/* out %eax, $port: each report has its own port, 0x80 + its number. */
static void report(const char *label)
{
	labels[nreports] = label;
	EMIT(0xe7, (uint8_t)(0x80 + nreports));
	nreports++;
}

static void mov_eax_imm(uint32_t v)
{
	EMIT(0xb8);
	emit(&v, 4);
}

static void cpuid_leaf(uint32_t leaf, int synthetic, const char *what)
{
	mov_eax_imm(leaf);
	EMIT(0x31, 0xc9); /* xor %ecx,%ecx */
	if (synthetic)    /* invlpg 0xffffffffff4d5650 (disp32 form) */
		EMIT(0x0f, 0x01, 0x3c, 0x25, 0x50, 0x56, 0x4d, 0xff);
	EMIT(0x0f, 0xa2); /* cpuid */
	char *l;
	for (int r = 0; r < 4; r++) {
		static const char *reg[] = { "eax", "ebx", "ecx", "edx" };
		static const uint8_t mov[] = { 0, 0xd8, 0xc8, 0xd0 }; /* mov %e?x,%eax */
		if (r)
			EMIT(0x89, mov[r]);
		if (asprintf(&l, "%s cpuid %#x %s (%s)", synthetic ? "synthetic" : "plain",
			     leaf, reg[r], what) < 0)
			die("asprintf");
		report(l);
	}
}

static void build_guest(long msr, uint32_t loops)
{
	uint64_t *pml4 = (uint64_t *)(mem + PML4), *pdpt = (uint64_t *)(mem + PDPT);
	uint64_t *pd = (uint64_t *)(mem + PD);

	/* Identity map of the first 4 MiB, 2 MiB pages, supervisor only (-u: user). */
	pml4[0] = PDPT | 3;
	pdpt[0] = PD | 3;
	pd[0] = 0x000000 | 0x83;
	pd[1] = 0x200000 | 0x83;
	if (user_mode) {
		pml4[0] |= 4;
		pdpt[0] |= 4;
		pd[0] |= 4;
		pd[1] |= 4;
	}

	pc = mem + CODE;
	if (loops) {
		/*
		 * Spin first: mov $loops,%ecx; 1: dec %ecx; jnz 1b. A host that
		 * emulates the first instructions after a mode change (in batches)
		 * has handed the vCPU to the hardware by the end of it, and the
		 * time the loop takes tells emulated execution from native.
		 */
		EMIT(0xb9);
		emit(&loops, 4);
		EMIT(0xff, 0xc9, 0x75, 0xfc);
	}
	EMIT(0x8c, 0xc8); /* mov %cs,%eax */
	report("hardware CS selector (RPL = low 2 bits)");
	EMIT(0x9c, 0x58); /* pushfq; pop %rax */
	report("hardware RFLAGS (IF = bit 9)");
	cpuid_leaf(0x40000000, 1, "KVM signature leaf");
	cpuid_leaf(0x40000001, 1, "KVM features");
	cpuid_leaf(0x40000002, 1, "virt-pvm vendor leaf, ebx 0x4d5650 = PVM");
	cpuid_leaf(0x40000200, 1, "aledbf v1 PVM signature leaf");
	cpuid_leaf(0x40000201, 1, "aledbf v1 ABI version / features");
	cpuid_leaf(0x40000000, 0, "without the INVLPG prefix");
	if (msr >= 0) {
		char *l;

		EMIT(0xb9);
		uint32_t m = (uint32_t)msr;
		emit(&m, 4); /* mov $msr,%ecx */
		EMIT(0x0f, 0x32); /* rdmsr */
		if (asprintf(&l, "rdmsr %#x eax", m) < 0)
			die("asprintf");
		report(l);
		EMIT(0x89, 0xd0);
		if (asprintf(&l, "rdmsr %#x edx", m) < 0)
			die("asprintf");
		report(l);
	}
	EMIT(0xf4);             /* hlt */
	EMIT(0xeb, 0xfe);       /* jmp . */
}

static void set_seg(struct kvm_segment *s, uint16_t sel, uint8_t type, int l, int db)
{
	memset(s, 0, sizeof(*s));
	s->selector = sel;
	s->limit = 0xfffff;
	s->type = type;
	s->present = 1;
	s->s = 1;
	s->l = l;
	s->db = db;
	s->g = 1;
}

static void print_sregs(const char *when)
{
	struct kvm_sregs s;

	if (ioctl(vcpu, KVM_GET_SREGS, &s) < 0)
		die("KVM_GET_SREGS");
	printf("sregs %s: cs=%#x base=%#llx dpl=%u l=%u  cr0=%#llx cr4=%#llx efer=%#llx\n",
	       when, s.cs.selector, (unsigned long long)s.cs.base, s.cs.dpl, s.cs.l,
	       (unsigned long long)s.cr0, (unsigned long long)s.cr4,
	       (unsigned long long)s.efer);
}

static void enter_long_mode(void)
{
	struct kvm_sregs s;
	struct kvm_regs r;

	if (ioctl(vcpu, KVM_GET_SREGS, &s) < 0)
		die("KVM_GET_SREGS");
	s.cr0 = 0x80050033; /* PG AM WP NE ET MP PE */
	s.cr3 = PML4;
	s.cr4 = 0x20;       /* PAE */
	s.efer = 0xd01;     /* NXE LMA LME SCE */
	set_seg(&s.cs, 0x10, 0xb, 1, 0);
	set_seg(&s.ds, 0x18, 0x3, 0, 1);
	if (user_mode) { /* Linux's user selectors, DPL 3 */
		set_seg(&s.cs, 0x33, 0xb, 1, 0);
		set_seg(&s.ds, 0x2b, 0x3, 0, 1);
		s.cs.dpl = s.ds.dpl = 3;
	}
	s.es = s.fs = s.gs = s.ss = s.ds;
	memset(&s.ldt, 0, sizeof(s.ldt));
	s.tr.present = 1;
	s.tr.type = 11;
	if (ioctl(vcpu, KVM_SET_SREGS, &s) < 0)
		die("KVM_SET_SREGS");
	memset(&r, 0, sizeof(r));
	r.rip = CODE;
	r.rsp = STACK;
	r.rflags = user_mode ? 0x3202 : 0x202; /* IOPL 3 lets user mode report */
	if (ioctl(vcpu, KVM_SET_REGS, &r) < 0)
		die("KVM_SET_REGS");
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void run_guest(void)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	int got = 0;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	alarm(10);
	printf("guest run:\n");
	for (int exits = 0; exits < 10000; exits++) {
		if (ioctl(vcpu, KVM_RUN, 0) < 0) {
			printf("  KVM_RUN: %s%s\n", strerror(errno),
			       errno == EINTR ? " (10 s timeout)" : "");
			break;
		}
		if (run->exit_reason == KVM_EXIT_IO && run->io.direction == KVM_EXIT_IO_OUT &&
		    run->io.port >= 0x80 && run->io.port < 0x80 + nreports) {
			uint32_t v;
			int i = run->io.port - 0x80;

			memcpy(&v, (uint8_t *)run + run->io.data_offset, 4);
			printf("  %-72s %#010x", labels[i], v);
			if (i == 0)
				printf("  (RPL %u)", v & 3);
			if (i == 1)
				printf("  (IF=%u)", (v >> 9) & 1);
			printf("\n");
			got++;
			continue;
		}
		struct kvm_regs r;

		ioctl(vcpu, KVM_GET_REGS, &r);
		printf("  stopped: exit %s (%u) at rip %#llx after %d of %d reports",
		       exit_name(run->exit_reason), run->exit_reason,
		       (unsigned long long)r.rip, got, nreports);
		if (run->exit_reason == KVM_EXIT_INTERNAL_ERROR)
			printf(", suberror %u", run->internal.suberror);
		if (run->exit_reason == KVM_EXIT_IO)
			printf(", port %#x", run->io.port);
		printf("\n");
		break;
	}
	alarm(0);
}

int main(int argc, char **argv)
{
	uint32_t loops = 0;
	long msr = -1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-u"))
			user_mode = 1;
		else if (!strcmp(argv[i], "-l") && i + 1 < argc)
			loops = strtoul(argv[++i], NULL, 0);
		else
			msr = strtol(argv[i], NULL, 16);
	}

	kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm < 0)
		die("/dev/kvm");
	printf("KVM_GET_API_VERSION: %d\n", ioctl(kvm, KVM_GET_API_VERSION, 0));
	dump_cpuid(KVM_GET_SUPPORTED_CPUID, "KVM_GET_SUPPORTED_CPUID");
	dump_cpuid(KVM_GET_EMULATED_CPUID, "KVM_GET_EMULATED_CPUID");
	dump_msr_list();

	vm = ioctl(kvm, KVM_CREATE_VM, 0);
	if (vm < 0)
		die("KVM_CREATE_VM");
	mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap");
	struct kvm_userspace_memory_region reg = {
		.slot = 0, .guest_phys_addr = 0, .memory_size = MEM_SIZE,
		.userspace_addr = (uintptr_t)mem,
	};
	if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &reg) < 0)
		die("KVM_SET_USER_MEMORY_REGION");
	vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
	if (vcpu < 0)
		die("KVM_CREATE_VCPU");
	int sz = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
	run = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
	if (run == MAP_FAILED)
		die("mmap kvm_run");

	/* The VMM's CPUID table: all that the host supports, as QEMU -cpu host. */
	int n = 512;
	struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + n * sizeof(c->entries[0]));
	c->nent = n;
	if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, c) < 0 || ioctl(vcpu, KVM_SET_CPUID2, c) < 0)
		die("KVM_SET_CPUID2");

	print_sregs("at reset");
	probe_msrs();
	build_guest(msr, loops);
	enter_long_mode();
	print_sregs("after KVM_SET_SREGS (64-bit, CPL 0)");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	run_guest();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("guest run took %.3f s", dt);
	if (loops)
		printf(" (%u-iteration spin first: %.1f ns per iteration at most)", loops,
		       dt * 1e9 / loops);
	printf("\n");
	print_sregs("after the run");
	return 0;
}
