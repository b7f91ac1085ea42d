// The system-effects observer's history: what the processes of a watched
// run did, recorded in the kernel and read through one ring buffer. Built
// by build.rs with
//   clang -O2 -g -target bpf -mcpu=v3 -D__TARGET_ARCH_x86 -c history.bpf.c
// and loaded by the allox-ebpf-probes crate (`History`, src/history.rs).
//
// Watched: a task whose tgid is in PIDS, or whose cgroup is in WATCHED
// (then its tgid joins PIDS, so that it stays watched wherever it moves);
// a forked process inherits its parent's tag. Everything else is filtered
// here, in the kernel. While no cgroup is watched (GATE[0] == 0) every hook
// returns at once. Otherwise the answer for the current thread is kept in
// a per-CPU slot (SEEN) keyed by thread, cgroup and epoch, so that a
// thread's next hooks on that CPU (its sys_exit after its sys_enter, its
// next call) cost no hash lookup; the epoch moves whenever an answer may
// change without the key changing: a watch or unwatch (GATE[1], from user
// space) and a fork or exit of a watched process (EPOCH, from here).
//
// Programs (every one records only; none ever refuses anything):
//   tp_btf/sched_process_{fork,exec,exit}  process lineage (as the tracker)
//   tp_btf/sys_enter, tp_btf/sys_exit      every call counted once, at
//                                          exit (exit and exit_group at
//                                          enter); the calls in RECORDED
//                                          recorded at exit with their
//                                          result
//   lsm/..., lsm.s/...                     path changes, write opens, bpf,
//                                          mounts, module loads, netlink
//                                          messages, signals
//   cgroup/sysctl                          sysctl reads and writes of the
//                                          cgroup it is attached to
//
// Loss is exact: every record attempted takes the next number of SEQ
// (atomically, before reserving), so SEQ is the number of records emitted
// and a reader that received N of them lost exactly SEQ - N.
//
// CO-RE without vmlinux.h, as in tracker.bpf.c. x86-64 only: the syscall
// arguments are read from struct pt_regs by their x86-64 names.

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
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_RB_NO_WAKEUP 1

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#if !defined(__TARGET_ARCH_x86)
#error "history.bpf.c reads syscall arguments by their x86-64 register names"
#endif

// ------------------------------------------------ kernel structures (CO-RE)

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

struct signal_struct {
	atomic_t live;
	unsigned int flags;
	int group_exit_code;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct pid *thread_pid;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct signal_struct *signal;
	struct css_set *cgroups;
	__u64 start_time;
	char comm[16];
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
	unsigned long r8;
	unsigned long r9;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct vfsmount;

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	unsigned int f_flags;
	unsigned int f_mode;
} __attribute__((preserve_access_index));

struct sock {
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

struct sk_buff {
	unsigned char *data;
} __attribute__((preserve_access_index));

struct kernel_siginfo;
struct cred;
union bpf_attr;

// UAPI context of cgroup/sysctl programs (no CO-RE: the verifier rewrites
// context accesses itself).
struct bpf_sysctl {
	__u32 write;
	__u32 file_pos;
};

#define SIGNAL_GROUP_EXIT 0x00000004
// include/linux/fs.h; unchanged since 2.6.
#define FMODE_WRITE 0x2

// ------------------------------------------------------------- the record

#define K_FORK 1
#define K_EXEC 2
#define K_EXIT 3
#define K_SYSCALL 4
#define K_FILE_OPEN 10
#define K_PATH_UNLINK 11
#define K_PATH_MKDIR 12
#define K_PATH_RMDIR 13
#define K_PATH_RENAME 14
#define K_BPF 15
#define K_SB_MOUNT 16
#define K_KERNEL_READ_FILE 17
#define K_KERNEL_LOAD_DATA 18
#define K_NETLINK_SEND 19
#define K_TASK_KILL 20
#define K_SYSCTL 30

#define STR1_LEN 256
#define STR2_LEN 128
#define NARGS 6
#define MAX_SYSCALL 512
// x86-64 numbers of the two calls that never return.
#define NR_EXIT 60
#define NR_EXIT_GROUP 231

// One record in RING, mirrored by `HistoryRecordRaw` in
// src/history_record.rs (both sides pin the layout). Records without text
// stop before str1 (SHORT_RECORD bytes); the others are the whole struct,
// and the bytes of a string after its NUL are unspecified.
struct hrec {
	__u64 seq;     // SEQ's value for this record (0, 1, 2, ...)
	__u64 time_ns; // bpf_ktime_get_boot_ns()
	__u64 tag;     // the run's tag (0: sysctl of an untagged sub-cgroup)
	__u32 kind;    // K_*
	__u32 pid;     // thread id, initial pid namespace
	__u32 tgid;    // process id, initial pid namespace
	__u32 ppid;    // parent's tgid (0 when unknown: sysctl records)
	__s64 ret;     // syscall: return value; exit: wait status
	__s32 nr;      // syscall number, -1 for the others
	__u32 flags;   // file_open: f_flags; sysctl: 1 when a write;
		       // syscall: TEXT1_UNREAD | TEXT2_UNREAD
	__u64 args[NARGS]; // fork, exec, exit: [0] the pid and [1] the
			   // parent's in the process's own pid namespace
	char comm[16];
	char str1[STR1_LEN];
	char str2[STR2_LEN];
};

// A syscall record's flags: a string argument that could not be read
// (its text is empty, not the empty string).
#define TEXT1_UNREAD 1
#define TEXT2_UNREAD 2

#define SHORT_RECORD __builtin_offsetof(struct hrec, str1)
#define FULL_RECORD sizeof(struct hrec)

_Static_assert(__builtin_offsetof(struct hrec, kind) == 24, "hrec layout");
_Static_assert(__builtin_offsetof(struct hrec, ret) == 40, "hrec layout");
_Static_assert(__builtin_offsetof(struct hrec, args) == 56, "hrec layout");
_Static_assert(__builtin_offsetof(struct hrec, comm) == 104, "hrec layout");
_Static_assert(__builtin_offsetof(struct hrec, str1) == 120, "hrec layout");
_Static_assert(__builtin_offsetof(struct hrec, str2) == 376, "hrec layout");
_Static_assert(sizeof(struct hrec) == 504, "hrec layout");

// What sys_enter keeps of a recorded call until its sys_exit.
struct inflight {
	__u64 tag;
	__s32 nr;
	__u16 has_text;
	__u16 unread; // TEXT1_UNREAD | TEXT2_UNREAD
	__u64 args[NARGS];
	char str1[STR1_LEN];
	char str2[STR2_LEN];
};

// RECORDED[nr]: whether the call is recorded, and which arguments are
// user strings to copy (an index 0-5, or 0xff for none).
struct spec {
	__u8 on;
	__u8 str1;
	__u8 str2;
	__u8 pad[5];
};

struct probe {
	__u32 tgid;
	__u32 pad;
	__u64 hits;
};

// ------------------------------------------------------------------ maps

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   // cgroup id (cgroup2 directory inode)
	__type(value, __u64); // run tag
} WATCHED SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);   // tgid
	__type(value, __u64); // run tag
} PIDS SEC(".maps");

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
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SYSCALL);
	__type(key, __u32);
	__type(value, struct spec);
} RECORDED SEC(".maps");

// A call that never returns (exit, a fatal signal to oneself) leaves its
// entry behind: the least recently used goes first.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); // pid_tgid
	__type(value, struct inflight);
} INFLIGHT SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct inflight);
} SCRATCH SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} RING SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64); // records attempted so far
} SEQ SEC(".maps");

#define COUNT_SYSCALLS 0
#define COUNT_REFUSED 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} COUNTS SEC(".maps");

// The loader's check that BPF LSM programs really run: lsm/bpf counts the
// bpf() calls of PROBE.tgid.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct probe);
} PROBE SEC(".maps");

// [0]: cgroups watched (set by user space); [1]: user space's epoch.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} GATE SEC(".maps");

// The programs' epoch.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} EPOCH SEC(".maps");

// The last answer on this CPU. `check` guards against a slot half
// written by a program that a nested one interrupted: a slot whose check
// does not match is not used.
struct seen {
	__u64 pid_tgid;
	__u64 cgroup;
	__u64 epoch;
	__u64 tag; // 0: not watched
	__u64 check;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct seen);
} SEEN SEC(".maps");

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// --------------------------------------------------------------- helpers

static __always_inline void count(__u32 which)
{
	__u64 *n = bpf_map_lookup_elem(&COUNTS, &which);
	if (n)
		*n += 1; // per CPU: no other writer
}

// Whether nothing is watched: every hook returns at once.
static __always_inline bool idle(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&GATE, &zero);
	return n && *n == 0;
}

static __always_inline __u64 epoch(void)
{
	__u32 zero = 0, one = 1;
	__u64 *ours = bpf_map_lookup_elem(&EPOCH, &zero);
	__u64 *theirs = bpf_map_lookup_elem(&GATE, &one);
	// Both only grow: their sum moves whenever either does.
	return (ours ? *ours : 0) + (theirs ? *theirs : 0);
}

static __always_inline void new_epoch(void)
{
	__u32 zero = 0;
	__u64 *e = bpf_map_lookup_elem(&EPOCH, &zero);
	if (e)
		__sync_fetch_and_add(e, 1);
}

#define SEEN_CHECK 0x9e3779b97f4a7c15ULL

// The tag of the current task, 0 when it is not watched. A task found by
// its cgroup joins PIDS.
static __always_inline __u64 current_tag_value(void)
{
	if (idle())
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u64 cg = bpf_get_current_cgroup_id();
	__u64 ep = epoch();
	__u32 zero = 0;
	struct seen *s = bpf_map_lookup_elem(&SEEN, &zero);
	if (s && s->pid_tgid == id && s->cgroup == cg && s->epoch == ep &&
	    s->check == (id ^ cg ^ ep ^ s->tag ^ SEEN_CHECK))
		return s->tag;
	__u32 tgid = id >> 32;
	__u64 tag = 0;
	__u64 *t = bpf_map_lookup_elem(&PIDS, &tgid);
	if (t) {
		tag = *t;
	} else {
		t = bpf_map_lookup_elem(&WATCHED, &cg);
		if (t) {
			tag = *t;
			bpf_map_update_elem(&PIDS, &tgid, &tag, BPF_ANY);
		}
	}
	if (s) {
		s->check = 0;
		s->pid_tgid = id;
		s->cgroup = cg;
		s->epoch = ep;
		s->tag = tag;
		s->check = id ^ cg ^ ep ^ tag ^ SEEN_CHECK;
	}
	return tag;
}

// current_tag_value() as a pointer to a copy on the caller's stack (NULL
// when not watched), for the hooks written against a map value.
#define current_tag()                                                      \
	({                                                                 \
		__u64 *_p = 0;                                             \
		_tagv = current_tag_value();                               \
		if (_tagv)                                                 \
			_p = &_tagv;                                       \
		_p;                                                        \
	})

static __always_inline __u64 *tag_of(__u32 tgid, struct task_struct *task)
{
	if (idle())
		return 0;
	__u64 *t = bpf_map_lookup_elem(&PIDS, &tgid);
	if (t)
		return t;
	__u64 cg = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	return bpf_map_lookup_elem(&WATCHED, &cg);
}

// Takes the next sequence number and reserves `size` bytes; the number is
// taken even when the ring is full, so that the loss shows.
static __always_inline struct hrec *reserve(__u64 size)
{
	__u32 zero = 0;
	__u64 *s = bpf_map_lookup_elem(&SEQ, &zero);
	if (!s)
		return NULL;
	__u64 seq = __sync_fetch_and_add(s, 1);
	struct hrec *r = bpf_ringbuf_reserve(&RING, size, 0);
	if (!r)
		return NULL;
	r->seq = seq;
	return r;
}

// Fills the header from the current task (pid, tgid, comm, time). `ppid`
// is filled by the caller.
static __always_inline void head(struct hrec *r, __u32 kind, __u64 tag)
{
	__u64 id = bpf_get_current_pid_tgid();
	r->time_ns = bpf_ktime_get_boot_ns();
	r->tag = tag;
	r->kind = kind;
	r->pid = (__u32)id;
	r->tgid = id >> 32;
	r->ppid = 0;
	r->ret = 0;
	r->nr = -1;
	r->flags = 0;
	for (int i = 0; i < NARGS; i++)
		r->args[i] = 0;
	bpf_get_current_comm(&r->comm, sizeof(r->comm));
}

static __always_inline void head_task(struct hrec *r, __u32 kind, __u64 tag)
{
	head(r, kind, tag);
	struct task_struct *cur = bpf_get_current_task_btf();
	r->ppid = BPF_CORE_READ(cur, real_parent, tgid);
}

#define MAX_PID_NS_LEVEL 32

// The number of `pid` in the pid namespace at `level`, 0 if `pid` is not
// visible there (as in tracker.bpf.c).
static __always_inline __u32 pid_nr_at(struct pid *pid, __u32 level)
{
	if (!pid || level >= MAX_PID_NS_LEVEL)
		return 0;
	if (level > BPF_CORE_READ(pid, level))
		return 0;
	const char *slot = (const char *)&pid->numbers[0] +
			   level * bpf_core_type_size(struct upid) +
			   bpf_core_field_offset(struct upid, nr);
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), slot);
	return nr;
}

// A process record's args[0] and args[1]: the process and its parent as
// the process's own (innermost) pid namespace numbers them.
static __always_inline void ns_pids(struct hrec *r, struct task_struct *task,
				    struct task_struct *parent)
{
	struct pid *own = BPF_CORE_READ(task, group_leader, thread_pid);
	__u32 level = BPF_CORE_READ(own, level);
	r->args[0] = pid_nr_at(own, level);
	r->args[1] = pid_nr_at(BPF_CORE_READ(parent, group_leader, thread_pid), level);
}

static __always_inline void dentry_name(char *dst, __u32 len, struct dentry *d)
{
	const unsigned char *name = BPF_CORE_READ(d, d_name.name);
	if (bpf_probe_read_kernel_str(dst, len, name) < 0)
		dst[0] = 0;
}

// ------------------------------------------------ processes (as tracker)

SEC("tp_btf/sched_process_fork")
int BPF_PROG(history_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 tgid = BPF_CORE_READ(child, tgid);
	if (BPF_CORE_READ(child, pid) != tgid)
		return 0; // a thread
	__u64 *t = tag_of(BPF_CORE_READ(parent, tgid), child);
	if (!t)
		return 0;
	__u64 tag = *t;
	bpf_map_update_elem(&PIDS, &tgid, &tag, BPF_ANY);
	// Its pid may be one an unwatched thread had, answered on some CPU.
	new_epoch();

	struct hrec *r = reserve(SHORT_RECORD);
	if (!r)
		return 0;
	head(r, K_FORK, tag);
	r->pid = tgid;
	r->tgid = tgid;
	r->ppid = BPF_CORE_READ(parent, tgid);
	ns_pids(r, child, parent);
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(history_exec, struct task_struct *p, int old_pid,
	     struct linux_binprm *bprm)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u64 *t = tag_of(tgid, p);
	if (!t)
		return 0;
	__u64 tag = *t;
	bpf_map_update_elem(&PIDS, &tgid, &tag, BPF_ANY);

	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head(r, K_EXEC, tag);
	r->ppid = BPF_CORE_READ(p, real_parent, tgid);
	ns_pids(r, p, BPF_CORE_READ(p, real_parent));
	const char *filename = BPF_CORE_READ(bprm, filename);
	if (bpf_probe_read_kernel_str(r->str1, sizeof(r->str1), filename) < 0)
		r->str1[0] = 0;
	r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(history_exit, struct task_struct *p)
{
	// See tracker.bpf.c: the last thread sees live == 0, and the EXITED
	// insert lets exactly one thread report.
	struct signal_struct *sig = BPF_CORE_READ(p, signal);
	if (BPF_CORE_READ(sig, live.counter) != 0)
		return 0;
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u64 *t = tag_of(tgid, p);
	if (!t)
		return 0;
	__u64 tag = *t;
	bpf_map_delete_elem(&PIDS, &tgid);
	// Its pid may come back for a process that is not watched.
	new_epoch();
	struct exit_key k = {};
	k.tgid = tgid;
	k.start = BPF_CORE_READ(p, group_leader, start_time);
	__u8 one = 1;
	if (bpf_map_update_elem(&EXITED, &k, &one, BPF_NOEXIST) != 0)
		return 0;

	struct hrec *r = reserve(SHORT_RECORD);
	if (!r)
		return 0;
	head(r, K_EXIT, tag);
	r->ppid = BPF_CORE_READ(p, real_parent, tgid);
	ns_pids(r, p, BPF_CORE_READ(p, real_parent));
	if (BPF_CORE_READ(sig, flags) & SIGNAL_GROUP_EXIT)
		r->ret = BPF_CORE_READ(sig, group_exit_code);
	else
		r->ret = BPF_CORE_READ(p, group_leader, exit_code);
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// ------------------------------------------------------------- syscalls

// Copies the user string argument `idx` of `args` (eight slots, the last
// two 0) into `dst`; `unread` if it is a string argument that could not
// be read, 0 otherwise.
static __always_inline __u16 user_str(char *dst, __u32 len, const __u64 *args,
				      __u8 idx, __u16 unread)
{
	if (idx < NARGS) {
		const char *src = (const char *)args[idx & 7];
		if (bpf_probe_read_user_str(dst, len, src) >= 0)
			return 0;
		dst[0] = 0;
		return unread;
	}
	dst[0] = 0;
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(history_sys_enter, struct pt_regs *regs, long id)
{
	// Calls are counted at sys_exit, which every call passes (those a
	// seccomp filter refuses skip sys_enter), once; but exit and
	// exit_group never come back. Any other call not recorded has
	// nothing to do here: it returns before asking whose call it is.
	if (id < 0 || id >= MAX_SYSCALL)
		return 0;
	__u32 nr = id;
	bool ends = id == NR_EXIT || id == NR_EXIT_GROUP;
	struct spec *sp = bpf_map_lookup_elem(&RECORDED, &nr);
	bool recorded = sp && sp->on;
	if (!recorded && !ends)
		return 0;
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	if (ends)
		count(COUNT_SYSCALLS);
	if (!recorded || !sp)
		return 0;
	__u32 zero = 0;
	struct inflight *f = bpf_map_lookup_elem(&SCRATCH, &zero);
	if (!f)
		return 0;
	f->tag = *t;
	f->nr = nr;
	f->args[0] = BPF_CORE_READ(regs, di);
	f->args[1] = BPF_CORE_READ(regs, si);
	f->args[2] = BPF_CORE_READ(regs, dx);
	f->args[3] = BPF_CORE_READ(regs, r10);
	f->args[4] = BPF_CORE_READ(regs, r8);
	f->args[5] = BPF_CORE_READ(regs, r9);
	__u8 s1 = sp->str1, s2 = sp->str2;
	f->has_text = s1 < NARGS || s2 < NARGS;
	__u64 a[8] = {f->args[0], f->args[1], f->args[2],
		      f->args[3], f->args[4], f->args[5]};
	f->unread = user_str(f->str1, sizeof(f->str1), a, s1, TEXT1_UNREAD) |
		    user_str(f->str2, sizeof(f->str2), a, s2, TEXT2_UNREAD);
	__u64 key = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&INFLIGHT, &key, f, BPF_ANY);
	return 0;
}

static __always_inline void syscall_record(struct hrec *r, struct inflight *f,
					   long ret)
{
	head_task(r, K_SYSCALL, f->tag);
	r->nr = f->nr;
	r->ret = ret;
	for (int i = 0; i < NARGS; i++)
		r->args[i] = f->args[i];
}

static __always_inline void refused_record(struct hrec *r, __u64 tag, __u32 nr,
					   long ret, const __u64 *a)
{
	head_task(r, K_SYSCALL, tag);
	r->nr = nr;
	r->ret = ret;
	for (int i = 0; i < NARGS; i++)
		r->args[i] = a[i];
}

SEC("tp_btf/sys_exit")
int BPF_PROG(history_sys_exit, struct pt_regs *regs, long ret)
{
	// Unwatched (the answer its sys_enter left on this CPU): nothing in
	// flight to look for. A thread whose run was unwatched while its call
	// was in flight leaves an entry the LRU map drops in time.
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	count(COUNT_SYSCALLS);
	if (ret < 0)
		count(COUNT_REFUSED);
	// A call not recorded left nothing in flight: no lookup. (`regs` is
	// the tracepoint's own argument: read directly, not by a helper.)
	long id = regs->orig_ax;
	if (id < 0 || id >= MAX_SYSCALL)
		return 0;
	__u32 nr = id;
	struct spec *sp = bpf_map_lookup_elem(&RECORDED, &nr);
	if (!sp || !sp->on)
		return 0;
	__u64 key = bpf_get_current_pid_tgid();
	struct inflight *f = bpf_map_lookup_elem(&INFLIGHT, &key);
	if (!f) {
		if (ret >= 0)
			return 0;
		// A recorded call refused before it began (by the sandbox's
		// seccomp filter, which runs before sys_enter): recorded here,
		// its arguments from the caller's registers, which the refusal
		// left as they were, and its strings read from them now (the
		// call did nothing, so they are what it was given).
		__u64 a[8] = {BPF_CORE_READ(regs, di), BPF_CORE_READ(regs, si),
			      BPF_CORE_READ(regs, dx), BPF_CORE_READ(regs, r10),
			      BPF_CORE_READ(regs, r8), BPF_CORE_READ(regs, r9)};
		__u8 s1 = sp->str1, s2 = sp->str2;
		if (s1 < NARGS || s2 < NARGS) {
			struct hrec *r = reserve(FULL_RECORD);
			if (!r)
				return 0;
			refused_record(r, *t, nr, ret, a);
			r->flags = user_str(r->str1, sizeof(r->str1), a, s1,
					    TEXT1_UNREAD) |
				   user_str(r->str2, sizeof(r->str2), a, s2,
					    TEXT2_UNREAD);
			bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
			return 0;
		}
		struct hrec *r = reserve(SHORT_RECORD);
		if (!r)
			return 0;
		refused_record(r, *t, nr, ret, a);
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		return 0;
	}
	if (f->has_text) {
		struct hrec *r = reserve(FULL_RECORD);
		if (r) {
			syscall_record(r, f, ret);
			r->flags = f->unread;
			__builtin_memcpy(r->str1, f->str1, sizeof(r->str1));
			__builtin_memcpy(r->str2, f->str2, sizeof(r->str2));
			bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		}
	} else {
		struct hrec *r = reserve(SHORT_RECORD);
		if (r) {
			syscall_record(r, f, ret);
			bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
		}
	}
	bpf_map_delete_elem(&INFLIGHT, &key);
	return 0;
}

// ------------------------------------------------------------ LSM hooks
//
// Each records and returns 0: the history observes, it never refuses.

SEC("lsm.s/file_open")
int BPF_PROG(history_file_open, struct file *file)
{
	if (!(BPF_CORE_READ(file, f_mode) & FMODE_WRITE))
		return 0;
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, K_FILE_OPEN, tag);
	r->flags = BPF_CORE_READ(file, f_flags);
	if (bpf_d_path(&file->f_path, r->str1, sizeof(r->str1)) < 0)
		r->str1[0] = 0;
	r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

static __always_inline int path_hook(__u32 kind, const struct path *dir,
				     struct dentry *dentry, __u64 arg)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, kind, tag);
	r->args[0] = arg;
	dentry_name(r->str1, sizeof(r->str1), dentry);
	dentry_name(r->str2, sizeof(r->str2), BPF_CORE_READ(dir, dentry));
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("lsm/path_unlink")
int BPF_PROG(history_path_unlink, const struct path *dir, struct dentry *dentry)
{
	return path_hook(K_PATH_UNLINK, dir, dentry, 0);
}

SEC("lsm/path_mkdir")
int BPF_PROG(history_path_mkdir, const struct path *dir, struct dentry *dentry,
	     unsigned short mode)
{
	return path_hook(K_PATH_MKDIR, dir, dentry, mode);
}

SEC("lsm/path_rmdir")
int BPF_PROG(history_path_rmdir, const struct path *dir, struct dentry *dentry)
{
	return path_hook(K_PATH_RMDIR, dir, dentry, 0);
}

// str1: the old name, str2: the new name.
SEC("lsm/path_rename")
int BPF_PROG(history_path_rename, const struct path *old_dir,
	     struct dentry *old_dentry, const struct path *new_dir,
	     struct dentry *new_dentry, unsigned int flags)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, K_PATH_RENAME, tag);
	r->args[0] = flags;
	dentry_name(r->str1, sizeof(r->str1), old_dentry);
	dentry_name(r->str2, sizeof(r->str2), new_dentry);
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("lsm/bpf")
int BPF_PROG(history_bpf, int cmd)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t) {
		__u32 zero = 0;
		struct probe *p = bpf_map_lookup_elem(&PROBE, &zero);
		if (p && p->tgid && p->tgid == bpf_get_current_pid_tgid() >> 32)
			__sync_fetch_and_add(&p->hits, 1);
		return 0;
	}
	__u64 tag = *t;
	struct hrec *r = reserve(SHORT_RECORD);
	if (!r)
		return 0;
	head_task(r, K_BPF, tag);
	r->args[0] = cmd;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// mount(2): str1 the source (device), str2 the filesystem type, args[0]
// the flags. Runs before the capability check, so refused mounts show.
SEC("lsm/sb_mount")
int BPF_PROG(history_sb_mount, const char *dev_name, const struct path *path,
	     const char *type, unsigned long flags)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, K_SB_MOUNT, tag);
	r->args[0] = flags;
	if (!dev_name || bpf_probe_read_kernel_str(r->str1, sizeof(r->str1), dev_name) < 0)
		r->str1[0] = 0;
	if (!type || bpf_probe_read_kernel_str(r->str2, sizeof(r->str2), type) < 0)
		r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// finit_module and the other kernel_read_file() readers: args[0] the
// kernel_read_file_id, str1 the file's path.
SEC("lsm.s/kernel_read_file")
int BPF_PROG(history_kernel_read_file, struct file *file, int id, bool contents)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, K_KERNEL_READ_FILE, tag);
	r->args[0] = id;
	r->args[1] = contents;
	if (bpf_d_path(&file->f_path, r->str1, sizeof(r->str1)) < 0)
		r->str1[0] = 0;
	r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// init_module and other loads from memory: args[0] the kernel_load_data_id.
SEC("lsm/kernel_load_data")
int BPF_PROG(history_kernel_load_data, int id, bool contents)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(SHORT_RECORD);
	if (!r)
		return 0;
	head_task(r, K_KERNEL_LOAD_DATA, tag);
	r->args[0] = id;
	r->args[1] = contents;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// args[0]: netlink protocol (0 route, 12 netfilter, ...); args[1], args[2]:
// the first message's nlmsg_type and nlmsg_flags.
SEC("lsm/netlink_send")
int BPF_PROG(history_netlink_send, struct sock *sk, struct sk_buff *skb)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(SHORT_RECORD);
	if (!r)
		return 0;
	head_task(r, K_NETLINK_SEND, tag);
	r->args[0] = BPF_CORE_READ(sk, sk_protocol);
	struct {
		__u32 len;
		__u16 type;
		__u16 flags;
	} nlh = {};
	unsigned char *data = BPF_CORE_READ(skb, data);
	if (data && bpf_probe_read_kernel(&nlh, sizeof(nlh), data) == 0) {
		r->args[1] = nlh.type;
		r->args[2] = nlh.flags;
	}
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// Signals the kernel allowed so far (the permission check comes first; a
// refused kill shows as the syscall's record). args[0]: target tgid,
// args[1]: signal; str1: the target's comm.
SEC("lsm/task_kill")
int BPF_PROG(history_task_kill, struct task_struct *p, struct kernel_siginfo *info,
	     int sig)
{
	__u64 _tagv;
	__u64 *t = current_tag();
	if (!t)
		return 0;
	__u64 tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 0;
	head_task(r, K_TASK_KILL, tag);
	r->args[0] = BPF_CORE_READ(p, tgid);
	r->args[1] = sig;
	if (bpf_probe_read_kernel_str(r->str1, 16, &p->comm) < 0)
		r->str1[0] = 0;
	r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}

// ------------------------------------------------------------- sysctl

// Attached to a run's cgroup: every sysctl read or write of a process in
// it (or below it). str1: the name ("net/ipv4/ip_forward"), str2: the new
// value of a write; flags 1 for a write. Always allows (returns 1).
SEC("cgroup/sysctl")
int history_sysctl(struct bpf_sysctl *ctx)
{
	__u64 tag = 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 *t = bpf_map_lookup_elem(&PIDS, &tgid);
	if (!t) {
		__u64 cg = bpf_get_current_cgroup_id();
		t = bpf_map_lookup_elem(&WATCHED, &cg);
	}
	if (t)
		tag = *t;
	struct hrec *r = reserve(FULL_RECORD);
	if (!r)
		return 1;
	head(r, K_SYSCTL, tag);
	__u32 write = ctx->write;
	r->flags = write ? 1 : 0;
	r->args[0] = ctx->file_pos;
	if (bpf_sysctl_get_name(ctx, r->str1, sizeof(r->str1), 0) < 0)
		r->str1[0] = 0;
	r->str2[0] = 0;
	if (write && bpf_sysctl_get_new_value(ctx, r->str2, sizeof(r->str2)) < 0)
		r->str2[0] = 0;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 1;
}
