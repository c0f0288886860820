//! `tablescan package`: the deployable zip, read back with the `zip` crate (not tablescan's
//! code). Entries, modes, no local settings, same bytes on every run; refuses a handler for the
//! other OS; and the unzipped package runs under the local Functions host.

mod support;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::e2e::TestApp;
use tablescan::app::catalog::FUNCTIONS;

const BIN: &str = env!("CARGO_BIN_EXE_tablescan");

fn tablescan(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run tablescan")
}

fn package(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["package", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    tablescan(&args)
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "tablescan failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// (name, unix mode, is_file, contents) of every entry, in archive order.
fn read_entries(zip: &Path) -> Vec<(String, u32, bool, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(zip).unwrap()).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut entry = archive.by_index(i).unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            (
                entry.name().to_string(),
                entry.unix_mode().expect("entry has a unix mode"),
                entry.is_file(),
                data,
            )
        })
        .collect()
}

fn expected_names(executable: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = FUNCTIONS
        .iter()
        .map(|f| format!("{}/function.json", f.name))
        .collect();
    names.insert("host.json".into());
    names.insert(executable.into());
    names
}

fn default_executable_path(host_json: &[u8]) -> String {
    let host: serde_json::Value = serde_json::from_slice(host_json).unwrap();
    host["customHandler"]["description"]["defaultExecutablePath"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn package_has_the_app_with_modes_and_same_bytes_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("app.zip");
    let second = dir.path().join("again.zip");
    assert_ok(&package(&first, &[]));
    assert_ok(&package(&second, &["--target", "linux", "--binary", BIN]));

    let entries = read_entries(&first);
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "entries in name order");
    assert_eq!(
        names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>(),
        expected_names("tablescan"),
        "exactly host.json, one function.json per catalog function, the handler"
    );
    assert_eq!(names.len(), FUNCTIONS.len() + 2, "no duplicates");
    assert!(!names
        .iter()
        .any(|n| n.contains("local.settings") || n.contains(".funcignore")));
    for (name, mode, is_file, data) in &entries {
        assert!(is_file, "{name} is a regular file");
        assert_eq!(mode & 0o170000, 0o100000, "{name}: S_IFREG");
        let want = if name == "tablescan" { 0o755 } else { 0o644 };
        assert_eq!(mode & 0o7777, want, "{name}: mode {:o}", mode & 0o7777);
        if name == "host.json" {
            assert_eq!(default_executable_path(data), "tablescan");
        }
        if let Some(function) = name.strip_suffix("/function.json") {
            assert_eq!(
                data.as_slice(),
                tablescan::app::stage::function_json(function)
                    .unwrap()
                    .as_bytes()
            );
        }
    }
    let handler = &entries.iter().find(|e| e.0 == "tablescan").unwrap().3;
    assert_eq!(
        handler,
        &std::fs::read(BIN).unwrap(),
        "the handler, byte for byte"
    );

    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap(),
        "two runs give the same bytes"
    );
    let leftovers: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &first && p != &second)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn windows_package_names_the_exe_and_a_binary_for_the_other_os_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A stand-in PE file: the package checks the format, it does not run the handler.
    let pe = dir.path().join("handler.bin");
    std::fs::write(&pe, b"MZ\x90\x00 stand-in Windows executable").unwrap();

    let windows = dir.path().join("win.zip");
    assert_ok(&package(
        &windows,
        &["--target", "windows", "--binary", pe.to_str().unwrap()],
    ));
    let entries = read_entries(&windows);
    assert_eq!(
        entries.iter().map(|e| e.0.clone()).collect::<BTreeSet<_>>(),
        expected_names("tablescan.exe")
    );
    let host = entries.iter().find(|e| e.0 == "host.json").unwrap();
    assert_eq!(default_executable_path(&host.3), "tablescan.exe");
    let exe = entries.iter().find(|e| e.0 == "tablescan.exe").unwrap();
    assert_eq!(exe.1 & 0o777, 0o755);

    // The usual mistake: a Windows build for a Linux plan (the default target), and the reverse.
    let refused = dir.path().join("refused.zip");
    let output = package(&refused, &["--binary", pe.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is a Windows (PE) executable, but --target linux needs a Linux (ELF)"),
        "{stderr}"
    );
    let output = package(&refused, &["--target", "windows"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is a Linux (ELF) executable, but --target windows needs a Windows (PE)"),
        "{stderr}"
    );
    assert!(!refused.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unzipped_package_runs_under_the_host() {
    let work = tempfile::tempdir().unwrap();
    let zip_path = work.path().join("app.zip");
    assert_ok(&package(&zip_path, &[]));

    let app_dir = tempfile::tempdir().unwrap();
    zip::ZipArchive::new(std::fs::File::open(&zip_path).unwrap())
        .unwrap()
        .extract(app_dir.path())
        .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(app_dir.path().join("tablescan"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o111,
            0o111,
            "extracted handler is executable: {mode:o}"
        );
    }
    assert!(!app_dir.path().join("local.settings.json").exists());

    let connection = support::azurite().connection_string();
    let app = TestApp::start_in(
        app_dir,
        1,
        &[("AzureWebJobsStorage", connection.as_str())],
        support::table_store().0,
        &[],
    )
    .await;
    let (status, body) = app.get("/api/scans").await;
    assert_eq!(status, 200, "{body}");
    assert!(body["scans"].is_array(), "{body}");
    app.shutdown().await;
}
