//! `rootfs-builder`: builds the guest's initramfs and store disk image, and
//! the container image.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use allox_rootfs_builder::{
    container, cpio, image, oci, output, store, Addition, Compression, ImageSpec, Profile,
};

#[derive(Parser)]
#[command(
    version,
    about = "Builds the Allox OS guest initramfs and store disk image"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a reproducible initramfs (newc cpio): same inputs, same bytes.
    Initramfs {
        #[command(flatten)]
        tree: TreeArgs,
        /// Where to write the image.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value_t = CompressArg::None)]
        compress: CompressArg,
    },
    /// Write the OCI container image (entrypoint `allox-init container`):
    /// the initramfs's tree plus alloxctl and mkfs.btrfs with its
    /// libraries, as an OCI image layout directory and optionally one tar
    /// of it for `podman load` / `ctr images import`. Same inputs, same
    /// bytes; prints the image's digest.
    Oci {
        #[command(flatten)]
        tree: TreeArgs,
        /// The alloxctl binary (static), installed as /usr/bin/alloxctl.
        #[arg(long)]
        alloxctl: PathBuf,
        /// The host's mkfs.btrfs, copied with its shared libraries.
        #[arg(long, default_value = "/usr/sbin/mkfs.btrfs")]
        mkfs: PathBuf,
        /// The OCI image layout directory to write (new or empty).
        #[arg(long)]
        out: PathBuf,
        /// Also write the layout as one tar (an oci-archive).
        #[arg(long, value_name = "FILE")]
        archive: Option<PathBuf>,
        /// The image's name, NAME[:TAG] (e.g. localhost/allox:dev).
        #[arg(long)]
        tag: String,
    },
    /// Create the blank (sparse, all zeros) store disk image.
    StoreImage {
        #[arg(long)]
        out: PathBuf,
        /// Size with an optional K, M, G or T suffix (powers of 1024).
        #[arg(long, default_value = "1G")]
        size: String,
        /// Overwrite an existing non-empty file.
        #[arg(long)]
        force: bool,
        /// Format it with the host's `mkfs.btrfs -q -L allox-store`.
        #[arg(long)]
        format: bool,
    },
    /// List the entries of an initramfs (plain or gzip).
    List { file: PathBuf },
}

/// What goes in the tree, for the initramfs and the container image.
#[derive(clap::Args)]
struct TreeArgs {
    /// The allox-init binary (static x86-64), installed as /init.
    #[arg(long)]
    init: PathBuf,
    /// The system-effects observer, allox-observe (static x86-64),
    /// installed as /allox-observe beside /init (where the supervisor
    /// looks for it), with the scope file /etc/allox/effects-scope.json
    /// (every domain of the machine). allox-init must pin its sha256
    /// (ALLOX_OBSERVE_SHA256 at build, scripts/build-release.sh).
    #[arg(long, value_name = "PATH", requires_all = ["verifier", "recover"])]
    observer: Option<PathBuf>,
    /// The system-effects verifier, allox-system-effects-verify (static
    /// x86-64), installed as /allox-system-effects-verify beside /init;
    /// given with --observer. allox-init must pin its sha256 too
    /// (ALLOX_VERIFY_SHA256 at build).
    #[arg(long, value_name = "PATH", requires = "observer")]
    verifier: Option<PathBuf>,
    /// The system-effects recover tool, allox-system-effects-recover
    /// (static x86-64), installed as /allox-system-effects-recover beside
    /// /init; given with --observer. allox-init must pin its sha256 too
    /// (ALLOX_RECOVER_SHA256 at build).
    #[arg(long, value_name = "PATH", requires = "observer")]
    recover: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = ProfileArg::Default)]
    profile: ProfileArg,
    /// A static busybox (Debian package busybox-static).
    #[arg(long, default_value = "/bin/busybox")]
    busybox: PathBuf,
    /// Copy a host file or directory into the image; a file replaces
    /// a file or symlink of the profile. Repeatable.
    #[arg(long = "add", value_name = "SRC:DEST")]
    additions: Vec<Addition>,
    /// The mtime of every entry (seconds since the epoch), and the
    /// container image's creation time.
    #[arg(long, env = "SOURCE_DATE_EPOCH", default_value_t = 0)]
    mtime: u32,
}

impl TreeArgs {
    fn spec(&self, additions: Vec<Addition>) -> ImageSpec {
        ImageSpec {
            init: self.init.clone(),
            observer: self.observer.clone(),
            verifier: self.verifier.clone(),
            recover: self.recover.clone(),
            busybox: self.busybox.clone(),
            profile: self.profile.into(),
            additions,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum ProfileArg {
    Default,
    Python,
}

impl From<ProfileArg> for Profile {
    fn from(p: ProfileArg) -> Profile {
        match p {
            ProfileArg::Default => Profile::Default,
            ProfileArg::Python => Profile::Python,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum CompressArg {
    None,
    Gzip,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli.cmd, &mut std::io::stdout().lock()) {
        // A closed pipe (`| head`) ends the output quietly.
        let broken_pipe = e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
        if !broken_pipe {
            eprintln!("rootfs-builder: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run(cmd: Cmd, out: &mut impl Write) -> anyhow::Result<()> {
    match cmd {
        Cmd::Initramfs {
            tree: args,
            out: file,
            compress,
        } => {
            let mtime = args.mtime;
            let spec = args.spec(args.additions.clone());
            let compression = match compress {
                CompressArg::None => Compression::None,
                CompressArg::Gzip => Compression::Gzip,
            };
            let tree = image::assemble(&spec)?;
            let s = output::write_file(&tree, &file, compression, mtime)?;
            writeln!(
                out,
                "{}: {} entries, {} bytes ({} bytes of cpio)",
                file.display(),
                s.entries,
                s.size,
                s.cpio_size
            )?;
            writeln!(out, "{}  {}", s.sha256, file.display())?;
        }
        Cmd::Oci {
            tree: args,
            alloxctl,
            mkfs,
            out: dir,
            archive,
            tag,
        } => {
            oci::check_tag(&tag)?;
            let mtime = args.mtime;
            let mut tree = image::assemble(&args.spec(Vec::new()))?;
            container::add(&mut tree, &alloxctl, &mkfs)?;
            // --add comes last, as for the initramfs.
            image::add_all(&mut tree, &args.additions)?;
            let profile_name = match args.profile {
                ProfileArg::Default => "default",
                ProfileArg::Python => "python",
            };
            let w = oci::write_layout(&tree, &dir, &tag, profile_name, mtime.into())?;
            writeln!(
                out,
                "{}: {} entries, layer {} bytes (diff_id {})",
                dir.display(),
                w.entries,
                w.layer_size,
                w.diff_id
            )?;
            if let Some(a) = archive {
                let size = oci::write_archive(&dir, &a, mtime.into())?;
                writeln!(out, "{}: {size} bytes (oci-archive)", a.display())?;
            }
            writeln!(out, "{}  {tag}", w.digest)?;
        }
        Cmd::StoreImage {
            out: file,
            size,
            force,
            format,
        } => {
            let bytes = store::parse_size(&size)?;
            store::create(&file, bytes, force)?;
            if format {
                store::format(&file)?;
            }
            let what = if format {
                "Btrfs (label allox-store)"
            } else {
                "blank"
            };
            writeln!(out, "{}: {what}, {bytes} bytes, sparse", file.display())?;
        }
        Cmd::List { file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("{}: cannot read", file.display()))?;
            let entries =
                output::read_archive(&bytes).with_context(|| file.display().to_string())?;
            for e in entries {
                let kind = match e.meta.mode & cpio::S_IFMT {
                    cpio::S_IFDIR => 'd',
                    cpio::S_IFLNK => 'l',
                    cpio::S_IFCHR => 'c',
                    _ => '-',
                };
                let link = if kind == 'l' {
                    format!(" -> {}", String::from_utf8_lossy(&e.data))
                } else {
                    String::new()
                };
                writeln!(
                    out,
                    "{kind}{:04o} {:>9} /{}{link}",
                    e.meta.mode & 0o7777,
                    e.data.len(),
                    e.name
                )?;
            }
        }
    }
    out.flush()?;
    Ok(())
}
