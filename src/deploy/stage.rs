//! `tablescan stage`: assemble a runnable function app folder from the definitions compiled
//! into this binary.
//!
//! host.json, every `function-defs/<Name>/function.json`, the local-settings sample and
//! `.funcignore` are embedded with `include_str!`, so the shipped binary alone can stage an app
//! (no checkout needed next to it). The staged layout is what the Functions host loads:
//!
//! ```text
//! out/host.json
//! out/<Name>/function.json      one folder per catalog function
//! out/tablescan                 the handler, at host.json's defaultExecutablePath
//! out/local.settings.json       from the sample, only if absent (never overwrites your settings)
//! out/.funcignore
//! ```

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::app::catalog::FUNCTIONS;

/// Whether this executable was built with the development tools (the `lab` feature), which
/// have no business in Azure.
pub const LAB_BUILD: bool = cfg!(feature = "lab");

/// host.json as shipped (`customHandler` names the handler executable).
pub const HOST_JSON: &str = include_str!("../../host.json");
/// local.settings.sample.json: every app setting the app reads, with local defaults.
pub const LOCAL_SETTINGS_SAMPLE: &str = include_str!("../../local.settings.sample.json");
/// .funcignore: keeps sources and build output out of a publish.
pub const FUNCIGNORE: &str = include_str!("../../.funcignore");

macro_rules! function_def {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../function-defs/", $name, "/function.json")),
        )
    };
}

/// `(function name, function.json)` for every function definition in `function-defs/`.
/// Tests check this list, the folders and the catalog agree both ways.
pub const FUNCTION_DEFINITIONS: &[(&str, &str)] = &[
    function_def!("StartScan"),
    function_def!("ListScans"),
    function_def!("GetScan"),
    function_def!("CancelScan"),
    function_def!("Lookup"),
    function_def!("PrefixScan"),
    function_def!("TableCopy"),
    function_def!("PrefixScanPoison"),
    function_def!("TableCopyPoison"),
    function_def!("ScanCleanup"),
    function_def!("PutSchedule"),
    function_def!("ListSchedules"),
    function_def!("GetSchedule"),
    function_def!("DeleteSchedule"),
    function_def!("Scheduler"),
];

/// The embedded function.json of `name`, if there is one.
pub fn function_json(name: &str) -> Option<&'static str> {
    FUNCTION_DEFINITIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, json)| *json)
}

/// Arguments of `tablescan stage`.
#[derive(Debug, Clone, Args)]
pub struct StageArgs {
    /// Folder to assemble the function app in (created if missing). The default, `staged`, is
    /// in .gitignore, as is `app`: the handler binary and local.settings.json written there must
    /// never be committed by a `git add .` at the repository root.
    #[arg(long, value_name = "DIR", default_value = "staged")]
    pub out: PathBuf,
    /// Handler binary to ship (default: this executable). Ship a build without the development
    /// tools (`cargo build --release --no-default-features`): a Linux musl build for Linux
    /// plans; a binary ending in `.exe` is staged as `tablescan.exe` for Windows plans.
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
}

/// What [`stage`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedApp {
    /// The app root (`out`).
    pub root: PathBuf,
    pub host_json: PathBuf,
    /// `<root>/<Name>/function.json`, in catalog order.
    pub function_jsons: Vec<PathBuf>,
    /// The handler, at the path host.json's `defaultExecutablePath` names.
    pub executable: PathBuf,
    pub local_settings: PathBuf,
    /// False when a local.settings.json was already there and kept.
    pub local_settings_written: bool,
    /// function.json files of functions no longer in the catalog, removed so the host does not
    /// load a function the handler does not serve.
    pub removed_stale: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("handler binary {} is not a file", .0.display())]
    BinaryNotAFile(PathBuf),
    #[error("cannot locate the current executable (pass --binary): {0}")]
    CurrentExe(#[source] io::Error),
    #[error("embedded host.json is unusable: {0}")]
    HostJson(String),
    #[error("no function.json embedded for catalog function {0}")]
    MissingDefinition(&'static str),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StageError {
    let path = path.to_path_buf();
    move |source| StageError::Io {
        action,
        path,
        source,
    }
}

/// host.json's `customHandler.description.defaultExecutablePath`.
pub fn default_executable_path(host_json: &str) -> Result<String, StageError> {
    let value: serde_json::Value =
        serde_json::from_str(host_json).map_err(|e| StageError::HostJson(e.to_string()))?;
    value
        .pointer("/customHandler/description/defaultExecutablePath")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            StageError::HostJson("customHandler.description.defaultExecutablePath missing".into())
        })
}

/// Whether `handler_binary` is staged as a Windows executable (its name ends in `.exe`).
pub fn is_windows_exe_name(handler_binary: &Path) -> bool {
    handler_binary
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("exe"))
}

/// host.json text and executable name to stage, for a Windows handler or not.
///
/// A Windows build must be named with `.exe` in host.json: the host starts
/// `defaultExecutablePath` as given, and a Windows process cannot be started from a file
/// without it. Everything else (Linux/musl builds) keeps the shipped name.
fn host_json_for(windows: bool) -> Result<(String, String), StageError> {
    let name = default_executable_path(HOST_JSON)?;
    if !windows || name.to_ascii_lowercase().ends_with(".exe") {
        return Ok((HOST_JSON.to_owned(), name));
    }
    let exe_name = format!("{name}.exe");
    let from = format!(
        "\"defaultExecutablePath\": {}",
        serde_json::Value::from(name.as_str())
    );
    let to = format!(
        "\"defaultExecutablePath\": {}",
        serde_json::Value::from(exe_name.as_str())
    );
    if HOST_JSON.matches(&from).count() != 1 {
        return Err(StageError::HostJson(format!(
            "expected exactly one `{from}` to rewrite for a Windows build"
        )));
    }
    let rewritten = HOST_JSON.replacen(&from, &to, 1);
    // Guard the textual edit: it must still parse and name the .exe.
    if default_executable_path(&rewritten)? != exe_name {
        return Err(StageError::HostJson(
            "rewriting defaultExecutablePath for .exe failed".into(),
        ));
    }
    Ok((rewritten, exe_name))
}

/// Assemble a function app in `out` that runs `handler_binary` as the custom handler (staged as
/// `tablescan.exe` when its name ends in `.exe`, see [`stage_as`]).
pub fn stage(out: &Path, handler_binary: &Path) -> Result<StagedApp, StageError> {
    stage_as(out, handler_binary, is_windows_exe_name(handler_binary))
}

/// [`stage`], with the executable name chosen by the caller: `windows` stages the handler as
/// `tablescan.exe` (and says so in host.json) whatever `handler_binary` is called.
pub fn stage_as(out: &Path, handler_binary: &Path, windows: bool) -> Result<StagedApp, StageError> {
    let meta =
        fs::metadata(handler_binary).map_err(io_err("reading handler binary", handler_binary))?;
    if !meta.is_file() {
        return Err(StageError::BinaryNotAFile(handler_binary.to_path_buf()));
    }
    // Resolve every definition before writing anything, so a bad build stages nothing.
    let defs = FUNCTIONS
        .iter()
        .map(|f| {
            function_json(f.name)
                .map(|json| (f.name, json))
                .ok_or(StageError::MissingDefinition(f.name))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (host_json_text, exe_name) = host_json_for(windows)?;

    fs::create_dir_all(out).map_err(io_err("creating", out))?;

    let host_json = out.join("host.json");
    fs::write(&host_json, host_json_text).map_err(io_err("writing", &host_json))?;

    let mut function_jsons = Vec::with_capacity(defs.len());
    for (name, json) in &defs {
        let dir = out.join(name);
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let path = dir.join("function.json");
        fs::write(&path, json).map_err(io_err("writing", &path))?;
        function_jsons.push(path);
    }
    let removed_stale = remove_stale_functions(out)?;

    let executable = out.join(&exe_name);
    install_executable(handler_binary, &executable)?;

    let local_settings = out.join("local.settings.json");
    let local_settings_written = !local_settings.exists();
    if local_settings_written {
        fs::write(&local_settings, LOCAL_SETTINGS_SAMPLE)
            .map_err(io_err("writing", &local_settings))?;
    }

    let funcignore = out.join(".funcignore");
    fs::write(&funcignore, FUNCIGNORE).map_err(io_err("writing", &funcignore))?;

    Ok(StagedApp {
        root: out.to_path_buf(),
        host_json,
        function_jsons,
        executable,
        local_settings,
        local_settings_written,
        removed_stale,
    })
}

/// Remove `<out>/<X>/function.json` for every X not in the catalog (left by an older stage);
/// the folder goes too when nothing else is in it.
fn remove_stale_functions(out: &Path) -> Result<Vec<PathBuf>, StageError> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(out).map_err(io_err("listing", out))? {
        let entry = entry.map_err(io_err("listing", out))?;
        let dir = entry.path();
        let function_json = dir.join("function.json");
        let known = entry
            .file_name()
            .to_str()
            .is_some_and(|n| FUNCTIONS.iter().any(|f| f.name == n));
        if known || !function_json.is_file() {
            continue;
        }
        fs::remove_file(&function_json).map_err(io_err("removing stale", &function_json))?;
        // Not empty means the user keeps something there; leave the folder.
        let _ = fs::remove_dir(&dir);
        removed.push(function_json);
    }
    removed.sort();
    Ok(removed)
}

/// Copy the handler to `dest` with the execute bit set.
///
/// Writes a temporary file and renames it over `dest`: overwriting a binary that a running
/// `func start` is executing fails on Linux (ETXTBSY), and copying a file onto itself would
/// truncate it. Renaming replaces the directory entry and leaves a running process alone.
fn install_executable(src: &Path, dest: &Path) -> Result<(), StageError> {
    if let (Ok(a), Ok(b)) = (fs::canonicalize(src), fs::canonicalize(dest)) {
        if a == b {
            return set_executable(dest);
        }
    }
    let file_name = dest.file_name().unwrap_or_else(|| OsStr::new("handler"));
    let tmp = dest.with_file_name(format!(
        ".{}.staging-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = fs::copy(src, &tmp)
        .map_err(io_err("copying handler binary to", &tmp))
        .and_then(|_| set_executable(&tmp))
        .and_then(|_| fs::rename(&tmp, dest).map_err(io_err("moving handler binary to", dest)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), StageError> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = fs::metadata(path)
        .map_err(io_err("reading", path))?
        .permissions();
    // rwxr-xr-x: the Functions host only adds the execute bit itself on Linux Consumption.
    perms.set_mode(perms.mode() | 0o755);
    fs::set_permissions(path, perms).map_err(io_err("making executable", path))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), StageError> {
    Ok(())
}

/// The handler binary `stage` and `package` ship: `--binary`, else this executable — with a note
/// when this is a development (`lab`) build, which is fine locally but not what Azure should run.
pub(crate) fn shipped_binary(binary: Option<PathBuf>, verb: &str) -> Result<PathBuf, StageError> {
    if let Some(path) = binary {
        return Ok(path);
    }
    if LAB_BUILD {
        eprintln!(
            "note: {verb} this tablescan, a development build (feature `lab`). Fine to run \
             locally; for Azure use a `cargo build --release --no-default-features` build (run \
             it, or pass it as --binary)."
        );
    }
    std::env::current_exe().map_err(StageError::CurrentExe)
}

/// `tablescan stage`: stage the app and say what was written.
pub fn run_stage(args: StageArgs) -> Result<StagedApp, StageError> {
    let binary = shipped_binary(args.binary, "staging")?;
    let staged = stage(&args.out, &binary)?;
    println!(
        "staged {} functions in {} (handler {})",
        staged.function_jsons.len(),
        staged.root.display(),
        staged.executable.display()
    );
    for path in &staged.removed_stale {
        println!("removed stale {}", path.display());
    }
    if !staged.local_settings_written {
        println!("kept existing {}", staged.local_settings.display());
    }
    Ok(staged)
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command, FromArgMatches};

    use super::StageArgs;

    /// `tablescan stage` with no `--out` writes where git ignores it, and so does the `--out app`
    /// the README uses: a 15 MB binary and local.settings.json stay out of `git add .`.
    #[test]
    fn the_default_and_documented_stage_folders_are_ignored_by_git() {
        let matches = StageArgs::augment_args(Command::new("stage"))
            .try_get_matches_from(["stage"])
            .unwrap();
        let args = StageArgs::from_arg_matches(&matches).unwrap();
        let ignored: Vec<&str> = include_str!("../../.gitignore").lines().collect();
        for dir in [args.out.to_str().unwrap(), "app"] {
            assert!(
                ignored.contains(&format!("/{dir}").as_str()),
                "{dir} is not in .gitignore: {ignored:?}"
            );
        }
    }
}
