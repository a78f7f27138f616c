// SPDX-License-Identifier: GPL-2.0
/*
 * glue.c: the C side of qcuda.ko, kept to what Rust cannot reach today.
 *
 * Linux has no Rust virtio abstraction and no virtio items in `bindings`, and several of
 * the calls a virtio driver needs are macros or static inlines (register_virtio_driver,
 * virtio_find_vqs, virtio_device_ready, vdev->config->del_vqs, sg_set_buf, sg_set_page,
 * sg_mark_end, page_to_pfn). This file wraps exactly those, owns the `struct virtio_driver` and forwards
 * the driver callbacks to Rust (qcuda_rs_*, in driver.rs). Exported virtio functions that
 * are real symbols (virtqueue_add_sgs, virtqueue_get_buf, ...) are declared in Rust
 * (virtio.rs) and called from its safe types. Everything virtio here can be replaced by a
 * Rust virtio abstraction once one exists upstream. At the end: the process lookup and
 * credential check of CUDA's process checkpoint (process.rs), which need RCU and inlines.
 */
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/sched/task.h>
#include <linux/scatterlist.h>
#include <linux/sched/signal.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>

/* Must match qcuda-proto's VIRTIO_ID_CUDA (unassigned in the virtio spec). */
#define QCUDA_VIRTIO_ID 56

/* Implemented in Rust (driver.rs). */
int qcuda_rs_probe(struct virtio_device *vdev);
void qcuda_rs_remove(struct virtio_device *vdev);
void qcuda_rs_request_done(void *priv);

/* Prototypes of the functions Rust calls (virtio.rs declares the same). */
int qcuda_glue_register(void);
void qcuda_glue_unregister(void);
int qcuda_glue_find_vqs(struct virtio_device *vdev, struct virtqueue **requests,
			struct virtqueue **events);
void qcuda_glue_del_vqs(struct virtio_device *vdev);
void qcuda_glue_device_ready(struct virtio_device *vdev);
bool qcuda_glue_has_indirect(struct virtio_device *vdev);
void qcuda_glue_set_priv(struct virtio_device *vdev, void *priv);
void *qcuda_glue_get_priv(struct virtio_device *vdev);
struct device *qcuda_glue_device(struct virtio_device *vdev);
void qcuda_glue_sg_set_buf(struct scatterlist *sg, const void *buf, unsigned int len);
void qcuda_glue_sg_set_page(struct scatterlist *sg, struct page *page, unsigned int len,
			    unsigned int offset);
void qcuda_glue_sg_mark_end(struct scatterlist *sg);
unsigned long qcuda_glue_page_to_pfn(struct page *page);
struct page *qcuda_glue_alloc_chunk(unsigned int order);
void qcuda_glue_free_page(struct page *page);
bool qcuda_glue_fatal_signal_pending(void);
struct pid *qcuda_glue_current_process(void);
int qcuda_glue_process_of(int vpid, struct pid **process, int *nr);
void qcuda_glue_put_process(struct pid *process);

/*
 * Used-buffer notification of the request queue: runs in interrupt context. The driver's
 * state is vdev->priv; vq->priv belongs to the transport (virtio-pci keeps the queue's
 * notify address there).
 */
static void qcuda_glue_requests_done(struct virtqueue *vq)
{
	qcuda_rs_request_done(vq->vdev->priv);
}

static int qcuda_glue_probe(struct virtio_device *vdev)
{
	return qcuda_rs_probe(vdev);
}

static void qcuda_glue_remove(struct virtio_device *vdev)
{
	qcuda_rs_remove(vdev);
}

static const struct virtio_device_id qcuda_id_table[] = {
	{ QCUDA_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, qcuda_id_table);

/*
 * No device-specific feature bits. The transport features the device offers (VERSION_1,
 * RING_INDIRECT_DESC, RING_EVENT_IDX) are accepted by the virtio core itself.
 */
static struct virtio_driver qcuda_virtio_driver = {
	.driver.name = KBUILD_MODNAME,
	.id_table = qcuda_id_table,
	.probe = qcuda_glue_probe,
	.remove = qcuda_glue_remove,
};

int qcuda_glue_register(void)
{
	return register_virtio_driver(&qcuda_virtio_driver);
}

void qcuda_glue_unregister(void)
{
	unregister_virtio_driver(&qcuda_virtio_driver);
}

/*
 * Sets up queue 0 (requests, with a used-buffer callback) and queue 1 (reserved for
 * host-to-guest events; no buffers are posted to it yet, so no callback).
 */
int qcuda_glue_find_vqs(struct virtio_device *vdev, struct virtqueue **requests,
			struct virtqueue **events)
{
	struct virtqueue_info info[2] = {
		{ .name = "requests", .callback = qcuda_glue_requests_done },
		{ .name = "events" },
	};
	struct virtqueue *vqs[2];
	int err;

	err = virtio_find_vqs(vdev, 2, vqs, info, NULL);
	if (err)
		return err;
	*requests = vqs[0];
	*events = vqs[1];
	return 0;
}

void qcuda_glue_del_vqs(struct virtio_device *vdev)
{
	vdev->config->del_vqs(vdev);
}

void qcuda_glue_device_ready(struct virtio_device *vdev)
{
	virtio_device_ready(vdev);
}

bool qcuda_glue_has_indirect(struct virtio_device *vdev)
{
	return virtio_has_feature(vdev, VIRTIO_RING_F_INDIRECT_DESC);
}

void qcuda_glue_set_priv(struct virtio_device *vdev, void *priv)
{
	vdev->priv = priv;
}

void *qcuda_glue_get_priv(struct virtio_device *vdev)
{
	return vdev->priv;
}

struct device *qcuda_glue_device(struct virtio_device *vdev)
{
	return &vdev->dev;
}

/*
 * Entries of a list chained by adjacency (the Chain of virtio.rs): each is set without touching
 * its end mark, and qcuda_glue_sg_mark_end ends each list. The entries start zeroed.
 */

/* One entry over linear-mapped (kmalloc) memory. */
void qcuda_glue_sg_set_buf(struct scatterlist *sg, const void *buf, unsigned int len)
{
	sg_set_buf(sg, buf, len);
}

/*
 * One entry over `len` bytes starting `offset` bytes into `page`; the caller guarantees that
 * the range is physically contiguous.
 */
void qcuda_glue_sg_set_page(struct scatterlist *sg, struct page *page, unsigned int len,
			    unsigned int offset)
{
	sg_set_page(sg, page, len, offset);
}

/* The last entry of a list. */
void qcuda_glue_sg_mark_end(struct scatterlist *sg)
{
	sg_mark_end(sg);
}

unsigned long qcuda_glue_page_to_pfn(struct page *page)
{
	return page_to_pfn(page);
}

/*
 * 1 << order zeroed, physically contiguous pages for host-mapped memory, split into order-0
 * pages (each with its own reference, as vm_insert_page wants). Larger orders fail fast
 * rather than reclaim hard: the caller falls back to smaller chunks.
 */
struct page *qcuda_glue_alloc_chunk(unsigned int order)
{
	/*
	 * Charged to the caller's memory cgroup, like any memory it maps; never the OOM killer's
	 * business: a failed allocation is cudaErrorMemoryAllocation for the caller.
	 */
	gfp_t gfp = GFP_USER | __GFP_ZERO | __GFP_NOWARN | __GFP_ACCOUNT;
	struct page *page;

	gfp |= order ? __GFP_NORETRY : __GFP_RETRY_MAYFAIL;
	page = alloc_pages(gfp, order);
	if (page && order)
		split_page(page, order);
	return page;
}

/* Drops one reference to an order-0 page. */
void qcuda_glue_free_page(struct page *page)
{
	__free_page(page);
}

/* Whether the calling task has been killed (SIGKILL pending): a static inline in C. */
bool qcuda_glue_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/*
 * Processes for CUDA's process checkpoint (process.rs): the thread group of the caller, and of
 * a thread another process names, held by their struct pid.
 */
struct pid *qcuda_glue_current_process(void)
{
	return get_pid(task_tgid(current));
}

/*
 * The thread group of thread vpid (the caller's pid namespace), referenced, with its id as the
 * caller numbers it, if the caller may act on it: its effective user is the process's real or
 * effective user, or it has CAP_SYS_PTRACE (root). -ESRCH: no such thread; -EPERM: not allowed.
 */
int qcuda_glue_process_of(int vpid, struct pid **process, int *nr)
{
	struct pid *pid = find_get_pid(vpid);
	struct task_struct *task;
	const struct cred *cred, *tcred;
	bool same_user;

	if (!pid)
		return -ESRCH;
	task = get_pid_task(pid, PIDTYPE_PID);
	put_pid(pid);
	if (!task)
		return -ESRCH;
	rcu_read_lock();
	cred = current_cred();
	tcred = __task_cred(task);
	same_user = uid_eq(cred->euid, tcred->uid) || uid_eq(cred->euid, tcred->euid);
	rcu_read_unlock();
	if (!same_user && !capable(CAP_SYS_PTRACE)) {
		put_task_struct(task);
		return -EPERM;
	}
	*process = get_pid(task_tgid(task));
	*nr = task_tgid_vnr(task);
	put_task_struct(task);
	return 0;
}

void qcuda_glue_put_process(struct pid *process)
{
	put_pid(process);
}
