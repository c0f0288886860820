//! `tablescan package`: the deployable zip, built from the same staged folder as `stage`.
//!
//! The app is staged into a temporary folder (see [`super::stage`]) and these files of it are
//! zipped, nothing else:
//!
//! ```text
//! host.json                 0644
//! <Name>/function.json      0644, one per catalog function
//! tablescan | tablescan.exe 0755, the handler (host.json's defaultExecutablePath)
//! ```
//!
//! No `local.settings.json` (local secrets; Azure reads app settings) and no `.funcignore`.
//! Each entry carries its unix mode, so the handler's execute bit survives whatever OS builds
//! the zip: an app's content is read-only in Azure, so a missing bit cannot be fixed there.
//! Entries are in name order with a fixed timestamp (1980-01-01 00:00), so the same inputs give
//! the same bytes.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use clap::{Args, ValueEnum};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use super::stage::{shipped_binary, stage_as, StageError};
use crate::app::catalog::FUNCTIONS;

/// The OS of the plan the package is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Target {
    /// Linux plans (Flex Consumption, Linux Consumption, Premium): an ELF handler `tablescan`.
    #[default]
    Linux,
    /// Windows plans: a PE handler `tablescan.exe`.
    Windows,
}

impl Target {
    fn format(self) -> BinaryFormat {
        match self {
            Target::Linux => BinaryFormat::Elf,
            Target::Windows => BinaryFormat::Pe,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Linux => "linux",
            Target::Windows => "windows",
        })
    }
}

/// An executable format, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryFormat {
    /// `\x7fELF`: Linux.
    Elf,
    /// `MZ`: Windows.
    Pe,
    /// Mach-O, either byte order, 32/64-bit or universal: macOS.
    MachO,
    Unknown,
}

impl BinaryFormat {
    /// The format of an executable starting with `head` (its first 4 bytes or fewer).
    pub fn detect(head: &[u8]) -> BinaryFormat {
        match head {
            [0x7f, b'E', b'L', b'F', ..] => BinaryFormat::Elf,
            [b'M', b'Z', ..] => BinaryFormat::Pe,
            [0xfe, 0xed, 0xfa, 0xce | 0xcf, ..]
            | [0xce | 0xcf, 0xfa, 0xed, 0xfe, ..]
            | [0xca, 0xfe, 0xba, 0xbe, ..] => BinaryFormat::MachO,
            _ => BinaryFormat::Unknown,
        }
    }
}

impl fmt::Display for BinaryFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BinaryFormat::Elf => "a Linux (ELF) executable",
            BinaryFormat::Pe => "a Windows (PE) executable",
            BinaryFormat::MachO => "a macOS (Mach-O) executable",
            BinaryFormat::Unknown => "not an executable we recognise",
        })
    }
}

/// Arguments of `tablescan package`.
#[derive(Debug, Clone, Args)]
pub struct PackageArgs {
    /// Zip file to write (replaced if it exists).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Handler binary to ship (default: this executable). Ship a build without the development
    /// tools (`cargo build --release --no-default-features`), for the OS of --target.
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// OS of the plan: decides the handler's name (`tablescan` or `tablescan.exe`) and which
    /// binaries are accepted (ELF or PE).
    #[arg(long, value_enum, default_value_t = Target::Linux)]
    pub target: Target,
}

/// What [`package`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub zip: PathBuf,
    /// Entry names, in the order written.
    pub entries: Vec<String>,
    /// The handler's entry name.
    pub executable: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },
    #[error(
        "handler binary {} is {found}, but --target {target} needs {}. {hint}",
        binary.display(), target.format()
    )]
    WrongFormat {
        binary: PathBuf,
        found: BinaryFormat,
        target: Target,
        hint: &'static str,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PackageError {
    let path = path.to_path_buf();
    move |source| PackageError::Io {
        action,
        path,
        source,
    }
}

/// Refuse a handler that cannot run on `target` (a Windows build for Linux, or the reverse).
pub fn check_binary(binary: &Path, target: Target) -> Result<(), PackageError> {
    let mut head = Vec::with_capacity(4);
    File::open(binary)
        .and_then(|f| f.take(4).read_to_end(&mut head))
        .map_err(io_err("reading handler binary", binary))?;
    let found = BinaryFormat::detect(&head);
    if found == target.format() {
        return Ok(());
    }
    let hint = match (target, found) {
        (Target::Linux, BinaryFormat::Pe) => {
            "Pass --target windows for a Windows plan, or --binary a Linux build \
             (cargo build --release --no-default-features --target x86_64-unknown-linux-musl)."
        }
        (Target::Linux, _) => {
            "Pass --binary a Linux build \
             (cargo build --release --no-default-features --target x86_64-unknown-linux-musl)."
        }
        (Target::Windows, BinaryFormat::Elf) => {
            "Pass --target linux for a Linux plan (Flex Consumption is Linux), or --binary a \
             Windows build (--target x86_64-pc-windows-msvc or x86_64-pc-windows-gnu)."
        }
        (Target::Windows, _) => {
            "Pass --binary a Windows build (--target x86_64-pc-windows-msvc or \
             x86_64-pc-windows-gnu)."
        }
    };
    Err(PackageError::WrongFormat {
        binary: binary.to_path_buf(),
        found,
        target,
        hint,
    })
}

/// A uniquely named folder under the system temp dir, removed on drop. (`tempfile` is a
/// development-only dependency; the shipped build needs no more than this.)
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, PackageError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let path = base.join(format!(
                "tablescan-package-{}-{nanos}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("creating", &base)(e)),
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Zip the app `handler_binary` runs as the custom handler of, for `target`, into `out`.
///
/// The zip is written next to `out` and renamed over it when complete, so a failure leaves no
/// half-written package.
pub fn package(out: &Path, handler_binary: &Path, target: Target) -> Result<Package, PackageError> {
    check_binary(handler_binary, target)?;
    let staging = TempDir::new()?;
    let staged = stage_as(&staging.0, handler_binary, target == Target::Windows)?;

    let relative = |path: &Path| -> String {
        path.strip_prefix(&staged.root)
            .unwrap_or(path)
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let executable = relative(&staged.executable);
    // (entry name, file, mode): only what the host loads; never local settings or .funcignore.
    let mut entries = vec![(relative(&staged.host_json), staged.host_json.clone(), 0o644)];
    debug_assert_eq!(staged.function_jsons.len(), FUNCTIONS.len());
    for path in &staged.function_jsons {
        entries.push((relative(path), path.clone(), 0o644));
    }
    entries.push((executable.clone(), staged.executable.clone(), 0o755));
    entries.sort_by(|a, b| a.0.cmp(&b.0));

    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app.zip".into());
    let partial = out.with_file_name(format!(".{file_name}.partial-{}", std::process::id()));
    let result = write_zip(&partial, &entries)
        .and_then(|()| fs::rename(&partial, out).map_err(io_err("moving the package to", out)));
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result?;
    Ok(Package {
        zip: out.to_path_buf(),
        entries: entries.into_iter().map(|(name, _, _)| name).collect(),
        executable,
    })
}

fn write_zip(path: &Path, entries: &[(String, PathBuf, u32)]) -> Result<(), PackageError> {
    let file = File::create(path).map_err(io_err("creating", path))?;
    let mut zip = ZipWriter::new(io::BufWriter::new(file));
    let zip_err = |source| PackageError::Zip {
        path: path.to_path_buf(),
        source,
    };
    for (name, source, mode) in entries {
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Deflated)
            .last_modified_time(DateTime::default())
            .unix_permissions(*mode);
        zip.start_file(name.as_str(), options).map_err(zip_err)?;
        let mut reader =
            BufReader::new(File::open(source).map_err(io_err("reading staged", source))?);
        io::copy(&mut reader, &mut zip).map_err(io_err("zipping", source))?;
    }
    let mut inner = zip.finish().map_err(zip_err)?;
    inner.flush().map_err(io_err("writing", path))?;
    let file = inner
        .into_inner()
        .map_err(|e| io_err("writing", path)(e.into_error()))?;
    file.sync_all().map_err(io_err("writing", path))?;
    Ok(())
}

/// `tablescan package`: build the zip and say what is in it.
pub fn run_package(args: PackageArgs) -> Result<Package, PackageError> {
    let binary = shipped_binary(args.binary, "packaging")?;
    let package = package(&args.out, &binary, args.target)?;
    println!(
        "packaged {} functions for {} in {} (handler {}, mode 0755)",
        package.entries.len() - 2,
        args.target,
        package.zip.display(),
        package.executable
    );
    Ok(package)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_magic_bytes() {
        assert_eq!(BinaryFormat::detect(b"\x7fELF\x02"), BinaryFormat::Elf);
        assert_eq!(BinaryFormat::detect(b"MZ\x90\x00"), BinaryFormat::Pe);
        assert_eq!(
            BinaryFormat::detect(&[0xcf, 0xfa, 0xed, 0xfe]),
            BinaryFormat::MachO
        );
        assert_eq!(
            BinaryFormat::detect(&[0xca, 0xfe, 0xba, 0xbe]),
            BinaryFormat::MachO
        );
        assert_eq!(BinaryFormat::detect(b"#!/b"), BinaryFormat::Unknown);
        assert_eq!(BinaryFormat::detect(b""), BinaryFormat::Unknown);
        assert_eq!(BinaryFormat::detect(b"M"), BinaryFormat::Unknown);
    }

    #[test]
    fn a_binary_for_the_other_os_is_refused_with_a_hint() {
        let dir = TempDir::new().unwrap();
        let pe = dir.0.join("tablescan.exe");
        fs::write(&pe, b"MZ\x90\x00rest").unwrap();
        let elf = dir.0.join("tablescan");
        fs::write(&elf, b"\x7fELFrest").unwrap();

        check_binary(&pe, Target::Windows).unwrap();
        check_binary(&elf, Target::Linux).unwrap();
        let err = check_binary(&pe, Target::Linux).unwrap_err().to_string();
        assert!(
            err.contains("is a Windows (PE) executable")
                && err.contains("--target linux needs a Linux (ELF) executable")
                && err.contains("--target windows"),
            "{err}"
        );
        let err = check_binary(&elf, Target::Windows).unwrap_err().to_string();
        assert!(err.contains("--target linux for a Linux plan"), "{err}");
        let out = dir.0.join("app.zip");
        assert!(matches!(
            package(&out, &elf, Target::Windows),
            Err(PackageError::WrongFormat { .. })
        ));
        assert!(!out.exists());
    }

    #[test]
    fn temp_dirs_are_unique_and_removed() {
        let a = TempDir::new().unwrap();
        let b = TempDir::new().unwrap();
        assert_ne!(a.0, b.0);
        let path = a.0.clone();
        fs::write(path.join("f"), b"x").unwrap();
        drop(a);
        assert!(!path.exists());
    }
}
