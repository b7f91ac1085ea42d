// Process tracker: fork, exec and exit of owned processes, reported through
// a ring buffer. Built by build.rs with
//   clang -O2 -g -target bpf -D__TARGET_ARCH_x86 -c tracker.bpf.c
// and loaded by the allox-ebpf-probes crate (aya, no libbpf at run time).
//
// CO-RE without vmlinux.h: the few kernel structures read here are declared
// below with only the fields used, marked preserve_access_index, so that
// clang records each access as a BTF relocation and the loader rewrites the
// offsets against the running kernel's /sys/kernel/btf/vmlinux.
//
// Ownership: user space puts (cgroup id -> owner) into CGROUPS before the
// first process is created in a cgroup, or (tgid -> owner) into PIDS. A new
// process inherits its parent's owner, else its cgroup's; every owned
// process is remembered in PIDS until its last thread exits. Processes that
// are not owned cost two hash lookups at fork and exec and one atomic read
// per exiting thread, and produce nothing.

// Types and UAPI constants, so that no kernel or libc header is needed
// (linux/bpf.h pulls in asm/types.h, which -target bpf cannot find).
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_RB_NO_WAKEUP 1

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

// The bits of the kernel's structures that are read; CO-RE fixes offsets.
typedef struct {
	int counter;
} __attribute__((preserve_access_index)) atomic_t;

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct signal_struct {
	atomic_t live;
	unsigned int flags;
	int group_exit_code;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct signal_struct *signal;
	struct pid *thread_pid;
	struct css_set *cgroups;
	__u64 start_time;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

// include/linux/sched/signal.h; unchanged since 2.6 (a macro, so not in BTF).
#define SIGNAL_GROUP_EXIT 0x00000004
// include/linux/pid_namespace.h MAX_PID_NS_LEVEL.
#define MAX_PID_NS_LEVEL 32

#define EVENT_FORK 1
#define EVENT_EXEC 2
#define EVENT_EXIT 3

#define COMM_LEN 16
#define FILENAME_LEN 256

// One record in EVENTS. Mirrored by `EventRecord` in src/event.rs; both
// sides pin the layout. Fork and exit records stop before `filename`
// (SHORT_EVENT bytes); exec records are the whole struct, and the bytes of
// `filename` after its terminating NUL are unspecified.
struct event {
	__u32 kind;        // EVENT_*
	__u32 pid;         // tgid, initial pid namespace
	__u32 ppid;        // parent's tgid, initial pid namespace
	__u32 ns_pid;      // tgid in the task's own (innermost) pid namespace
	__u32 ns_ppid;     // parent's tgid in that namespace, 0 if not visible
	__s32 exit_status; // exit: wait status; otherwise 0
	__u64 owner;       // the owner tag
	__u64 ts_ns;       // bpf_ktime_get_boot_ns()
	char comm[COMM_LEN];
	char filename[FILENAME_LEN];
};

#define SHORT_EVENT __builtin_offsetof(struct event, filename)

_Static_assert(__builtin_offsetof(struct event, owner) == 24, "event layout");
_Static_assert(__builtin_offsetof(struct event, comm) == 40, "event layout");
_Static_assert(__builtin_offsetof(struct event, filename) == 56, "event layout");
_Static_assert(sizeof(struct event) == 312, "event layout");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);   // tgid
	__type(value, __u64); // owner
} PIDS SEC(".maps");

// Least recently used goes first when full: a supervisor that runs for
// ever tags a cgroup per run and never needs the old ones again.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);   // cgroup id (cgroup2 directory inode)
	__type(value, __u64); // owner
} CGROUPS SEC(".maps");

// Processes whose exit has been reported, by tgid and start time (unique
// even when the pid is reused): when threads of one process exit at the
// same moment, more than one can see it as the last, and only the first
// to insert here reports.
struct exit_key {
	__u32 tgid;
	__u32 pad;
	__u64 start;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct exit_key);
	__type(value, __u8);
} EXITED SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} EVENTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64); // events that found the ring buffer full
} LOST SEC(".maps");

// bpf_probe_read_kernel and friends are GPL-only helpers.
char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline __u64 task_cgroup_id(struct task_struct *t)
{
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

// The number of `pid` in the pid namespace at `level`, 0 if `pid` is not
// visible there (it lives in an ancestor namespace).
static __always_inline __u32 pid_nr_at(struct pid *pid, __u32 level)
{
	if (!pid || level >= MAX_PID_NS_LEVEL)
		return 0;
	if (level > BPF_CORE_READ(pid, level))
		return 0;
	// numbers[] is indexed by a run-time value: offset of the array and
	// size of an element both come from the kernel's BTF.
	const char *slot = (const char *)&pid->numbers[0] +
			   level * bpf_core_type_size(struct upid) +
			   bpf_core_field_offset(struct upid, nr);
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), slot);
	return nr;
}

// The pid structure of a task's thread group (its leader's pid).
static __always_inline struct pid *tgid_pid(struct task_struct *t)
{
	return BPF_CORE_READ(t, group_leader, thread_pid);
}

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&LOST, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
}

// Fills everything but filename and exit_status. `task` is the process the
// event is about, `parent` the process reported as its parent.
static __always_inline void fill(struct event *e, __u32 kind, __u64 owner,
				 struct task_struct *task,
				 struct task_struct *parent)
{
	struct pid *own = tgid_pid(task);
	__u32 level = BPF_CORE_READ(own, level);

	e->kind = kind;
	e->pid = BPF_CORE_READ(task, tgid);
	e->ppid = BPF_CORE_READ(parent, tgid);
	e->ns_pid = pid_nr_at(own, level);
	e->ns_ppid = pid_nr_at(tgid_pid(parent), level);
	e->exit_status = 0;
	e->owner = owner;
	e->ts_ns = bpf_ktime_get_boot_ns();
	// current is the task itself (exec, exit) or its parent (fork), whose
	// comm the child has copied.
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
}

// The owner of a process: the one recorded for `tgid`, else the one of
// `task`'s cgroup (a run's cgroup is tagged before its first process).
static __always_inline __u64 *owner_of(__u32 tgid, struct task_struct *task)
{
	__u64 *o = bpf_map_lookup_elem(&PIDS, &tgid);
	if (o)
		return o;
	__u64 cgid = task_cgroup_id(task);
	return bpf_map_lookup_elem(&CGROUPS, &cgid);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(allox_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 tgid = BPF_CORE_READ(child, tgid);
	if (BPF_CORE_READ(child, pid) != tgid)
		return 0; // a thread, not a process

	// The parent's owner, else the child's cgroup's (not the parent's:
	// clone3 with CLONE_INTO_CGROUP creates it directly in a tagged one).
	__u64 *o = owner_of(BPF_CORE_READ(parent, tgid), child);
	if (!o)
		return 0;
	__u64 owner = *o;
	bpf_map_update_elem(&PIDS, &tgid, &owner, BPF_ANY);

	struct event *e = bpf_ringbuf_reserve(&EVENTS, SHORT_EVENT, 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill(e, EVENT_FORK, owner, child, parent);
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(allox_exec, struct task_struct *p, int old_pid,
	     struct linux_binprm *bprm)
{
	// de_thread() has run: p is the thread group leader now.
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u64 *o = owner_of(tgid, p);
	if (!o)
		return 0;
	__u64 owner = *o;
	bpf_map_update_elem(&PIDS, &tgid, &owner, BPF_ANY);

	struct event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(struct event), 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill(e, EVENT_EXEC, owner, p, BPF_CORE_READ(p, real_parent));
	const char *filename = BPF_CORE_READ(bprm, filename);
	if (bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), filename) < 0)
		e->filename[0] = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(allox_exit, struct task_struct *p)
{
	// do_exit() decrements signal->live before this tracepoint (since 2.6
	// and still in 6.18, where the tracepoint gained a group_dead argument
	// that older kernels lack). The last thread sees 0; a thread that
	// exits at the same moment may see 0 too, so the delete below decides
	// which one reports: only one delete of the tgid succeeds.
	struct signal_struct *sig = BPF_CORE_READ(p, signal);
	if (BPF_CORE_READ(sig, live.counter) != 0)
		return 0;

	// A process forked before these maps existed (a run of an earlier
	// supervisor, its cgroup tagged again) is found by its cgroup; so is a
	// thread racing the one that just deleted the entry, which the EXITED
	// insert below keeps from reporting twice.
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u64 *o = owner_of(tgid, p);
	if (!o)
		return 0;
	__u64 owner = *o;
	bpf_map_delete_elem(&PIDS, &tgid);
	struct exit_key k = {};
	k.tgid = tgid;
	k.start = BPF_CORE_READ(p, group_leader, start_time);
	__u8 one = 1;
	if (bpf_map_update_elem(&EXITED, &k, &one, BPF_NOEXIST) != 0)
		return 0;

	struct event *e = bpf_ringbuf_reserve(&EVENTS, SHORT_EVENT, 0);
	if (!e) {
		count_lost();
		return 0;
	}
	// p may be a thread other than the leader (the leader called
	// pthread_exit first): fill() reports the thread group.
	fill(e, EVENT_EXIT, owner, p, BPF_CORE_READ(p, real_parent));
	// What wait() will report (kernel/exit.c wait_task_zombie): the group
	// exit code after exit_group() or a fatal signal, else the leader's.
	if (BPF_CORE_READ(sig, flags) & SIGNAL_GROUP_EXIT)
		e->exit_status = BPF_CORE_READ(sig, group_exit_code);
	else
		e->exit_status = BPF_CORE_READ(p, group_leader, exit_code);
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

// A process moved into a tagged cgroup by another process after it was
// made: a run's PID 1 made ahead in its session's context (in the
// context's cgroup, which is not tagged), moved into the run's cgroup by
// the context when a run claims it. Reported as that run's fork, by the
// context, as a PID 1 cloned straight into the run's cgroup is (the
// context calls clone3 with CLONE_PARENT; the fork tracepoint names the
// caller as the parent). A process that moves itself in is followed from
// its next fork or exec, as before.
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(allox_attach, struct cgroup *dst, const char *path,
	     struct task_struct *task, bool threadgroup)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (BPF_CORE_READ(task, pid) != tgid)
		return 0; // a thread, not a process
	if ((__u32)(bpf_get_current_pid_tgid() >> 32) == tgid)
		return 0; // it moved itself
	if (bpf_map_lookup_elem(&PIDS, &tgid))
		return 0; // owned already: a move within what is followed
	__u64 cgid = BPF_CORE_READ(dst, kn, id);
	__u64 *o = bpf_map_lookup_elem(&CGROUPS, &cgid);
	if (!o)
		return 0;
	__u64 owner = *o;
	bpf_map_update_elem(&PIDS, &tgid, &owner, BPF_ANY);

	struct event *e = bpf_ringbuf_reserve(&EVENTS, SHORT_EVENT, 0);
	if (!e) {
		count_lost();
		return 0;
	}
	fill(e, EVENT_FORK, owner, task,
	     (struct task_struct *)bpf_get_current_task_btf());
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}
