//! What the manager needs of a VMM, as one interface: QEMU implements it
//! ([`crate::qemu::Qemu`]); a second VMM (Firecracker, Cloud Hypervisor)
//! would implement the same (docs/guest.md says what each would need).

use crate::{VmConfig, VmError, VmPaths};
use std::path::Path;

/// What the VMM says the guest is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Its vCPUs run.
    Running,
    /// Stopped where it was (paused, or after its state was saved).
    Paused,
    /// Still loading a saved state.
    Loading,
    /// Anything else the VMM reports (shutting down, an internal error).
    Other,
}

/// How the VMM is started and driven.
pub trait Backend: Send + Sync {
    /// The VMM's name, as `vm list` shows it.
    fn name(&self) -> &'static str;

    /// Starts the VMM for `cfg` with the files of `paths`, detached from the
    /// caller (it outlives it), and returns its process id once its control
    /// socket exists. With `incoming`, the guest is not booted: the VMM
    /// waits, paused, for a saved state ([`Backend::load`]).
    fn launch(&self, paths: &VmPaths, cfg: &VmConfig, incoming: bool) -> Result<u32, VmError>;

    /// The guest's state.
    fn status(&self, paths: &VmPaths) -> Result<RunState, VmError>;

    /// Stops the vCPUs where they are (devices quiesced, the disk flushed).
    fn pause(&self, paths: &VmPaths) -> Result<(), VmError>;

    /// Lets them run again.
    fn resume(&self, paths: &VmPaths) -> Result<(), VmError>;

    /// Writes the paused guest's memory and device state to `state`
    /// (which does not exist yet); the guest stays paused.
    fn save(&self, paths: &VmPaths, state: &Path) -> Result<(), VmError>;

    /// Loads `state` into a VMM started with `incoming`; the guest stays
    /// paused.
    fn load(&self, paths: &VmPaths, state: &Path) -> Result<(), VmError>;

    /// Presses the power button (ACPI): an orderly shutdown the guest's
    /// kernel is asked for.
    fn power_button(&self, paths: &VmPaths) -> Result<(), VmError>;

    /// Whether a host client holds the control port now (its socket takes
    /// one at a time).
    fn control_port_busy(&self, paths: &VmPaths) -> Result<bool, VmError>;

    /// How the host reaches the guest's control port: QEMU's is a
    /// virtio-serial port behind `ctl.sock`; a VMM without virtio-serial
    /// gives a hybrid vsock socket and a port.
    fn control(&self, paths: &VmPaths) -> crate::transport::ControlTransport {
        crate::transport::ControlTransport::Serial {
            socket: paths.ctl(),
        }
    }
}
