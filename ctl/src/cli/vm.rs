//! `alloxctl vm`: guests of this host under QEMU, each in its own
//! directory (`--vm-dir`), started, paused, resumed, saved, restored and
//! cloned (docs/guest.md, "The VM manager").

use super::Action;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand, Debug, PartialEq)]
pub enum VmCommand {
    /// Make a VM: its directory, configuration and store disk (blank,
    /// formatted on the first boot, or a copy of --store-image).
    Create {
        /// The VM's name.
        name: String,
        /// The kernel build (kernel/build.sh's output directory).
        #[arg(long, env = "ALLOX_KERNEL_DIR")]
        kernel_dir: PathBuf,
        /// The guest's initramfs (scripts/build-guest.sh).
        #[arg(long, env = "ALLOX_INITRD")]
        initrd: PathBuf,
        /// Guest memory, in MiB.
        #[arg(long, default_value_t = 512)]
        memory: u32,
        /// vCPUs.
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        /// Size of a blank store disk, in MiB.
        #[arg(long, default_value_t = 1024)]
        store_size: u64,
        /// Start from a copy of this store image instead.
        #[arg(long)]
        store_image: Option<PathBuf>,
        /// auto (KVM where an ordinary guest can run, else TCG), kvm or tcg.
        #[arg(long, default_value = "auto")]
        accel: String,
        /// More of the kernel command line, as it is.
        #[arg(long)]
        append: Option<String>,
        /// A network device on QEMU's user networking, restricted: the
        /// guest reaches nothing but the --forward addresses.
        #[arg(long)]
        net_user: bool,
        /// With --net-user (repeatable): a connection from the guest to
        /// ADDR:PORT (in 10.0.2.0/24) reaches 127.0.0.1:HOSTPORT here.
        #[arg(long, value_name = "ADDR:PORT=HOSTPORT", requires = "net_user")]
        forward: Vec<String>,
        /// allox.KEY=VALUE settings of the guest (docs/guest.md).
        #[arg(value_name = "allox.KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Boot the VM and wait for its control port's first answer.
    Start {
        /// The VM.
        name: String,
        /// How long to wait for the guest, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// The guest's orderly shutdown (system.shutdown, else the power
    /// button), waited for.
    Stop {
        /// The VM.
        name: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Cut the power: QEMU killed.
    Kill {
        /// The VM.
        name: String,
    },
    /// Stop the guest's vCPUs where they are; requests sent meanwhile wait.
    Pause {
        /// The VM.
        name: String,
    },
    /// Let a paused guest run again and set its clock from this host's.
    Resume {
        /// The VM.
        name: String,
        /// Leave the guest's clock as it is.
        #[arg(long)]
        no_clock: bool,
    },
    /// Save the guest (memory, devices, store disk) as a snapshot; a
    /// running guest goes on after.
    Snapshot {
        /// The VM.
        name: String,
        /// The snapshot's name.
        snapshot: String,
        /// Replace a snapshot of that name (the old one stays whole until
        /// the new one is).
        #[arg(long)]
        replace: bool,
    },
    /// Delete a snapshot.
    SnapshotRm {
        /// The VM.
        name: String,
        /// The snapshot.
        snapshot: String,
    },
    /// Start a stopped VM from one of its snapshots.
    Restore {
        /// The VM.
        name: String,
        /// The snapshot.
        snapshot: String,
    },
    /// A new VM started from a snapshot of another (its own disk, clock
    /// and random pool).
    Clone {
        /// The VM whose snapshot it is.
        from: String,
        /// The snapshot.
        snapshot: String,
        /// The new VM's name.
        name: String,
    },
    /// Every VM, its state and its snapshots.
    List,
    /// Relay stdin and stdout to 127.0.0.1:PORT (what QEMU runs for each
    /// connection of a --forward).
    Relay {
        /// The host's port.
        port: u16,
    },
    /// Remove a VM and its snapshots.
    Rm {
        /// The VM.
        name: String,
        /// Kill it first if it runs.
        #[arg(long)]
        force: bool,
    },
}

impl VmCommand {
    pub fn action(self) -> Action {
        Action::Vm(self)
    }
}
