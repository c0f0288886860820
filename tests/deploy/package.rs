//! `tablescan package`: the deployable zip, read back by readers that share no code with the
//! writer: Python's `zipfile` (names, unix modes, the OS that made each entry, contents' CRC) and
//! Info-ZIP `unzip` (extraction, which is what restores the execute bit on disk), plus the `zip`
//! crate. Entries, modes, no local settings, same bytes on every run; refuses a handler for the
//! other OS; and the unzipped package runs under the local Functions host and copies a table.

use crate::support;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::json;
use support::e2e::{seed, TestApp};
use support::raw::{self, RawClient};
use support::unique_name;
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

/// (name, unix mode, OS that made the entry (3 = Unix), CRC-32) of every entry, in archive order,
/// as Python's `zipfile` reads them.
fn python_entries(zip: &Path) -> Vec<(String, u32, u64, u64)> {
    let script = "import json, sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  print(json.dumps([[i.filename, i.external_attr >> 16, i.create_system, i.CRC] \
                  for i in z.infolist()]))\n\
                  assert z.testzip() is None";
    let output = Command::new("python3")
        .args(["-c", script])
        .arg(zip)
        .output()
        .expect("python3 (Debian package python3) reads the zip");
    assert_ok(&output);
    let rows: Vec<(String, u32, u64, u64)> = serde_json::from_slice(&output.stdout).unwrap();
    rows
}

/// CRC-32 (IEEE) of `data`, for comparing with what an independent reader reports. (zip's
/// checksum; a few lines rather than a dependency for one test.)
fn crc32(data: &[u8]) -> u64 {
    let mut crc = 0xffff_ffffu32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    u64::from(!crc)
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
                tablescan::deploy::stage::function_json(function)
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

    // The same, read by Python's zipfile: names, modes, made on Unix (so readers honour the
    // mode), and each entry's CRC equals that of the file the zip should hold.
    let python = python_entries(&first);
    assert_eq!(
        python.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        names,
        "python reads the same entries"
    );
    for ((name, mode, system, crc), (_, _, _, data)) in python.iter().zip(&entries) {
        assert_eq!(*system, 3, "{name}: made on Unix");
        let want = if name == "tablescan" {
            0o100755
        } else {
            0o100644
        };
        assert_eq!(*mode, want, "{name}: mode {mode:o} as python reads it");
        assert_eq!(*crc, crc32(data), "{name}: CRC");
    }
    let handler_crc = python.iter().find(|e| e.0 == "tablescan").unwrap().3;
    assert_eq!(handler_crc, crc32(&std::fs::read(BIN).unwrap()));

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

/// Extracts `zip` into `dir` with Info-ZIP `unzip`, which applies each entry's unix mode.
fn unzip(zip: &Path, dir: &Path) {
    let output = Command::new("unzip")
        .arg("-q")
        .arg(zip)
        .arg("-d")
        .arg(dir)
        .output()
        .expect("unzip (Debian package unzip) extracts the package");
    assert_ok(&output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unzipped_package_runs_under_the_host() {
    let work = tempfile::tempdir().unwrap();
    let zip_path = work.path().join("app.zip");
    assert_ok(&package(&zip_path, &[]));

    let app_dir = tempfile::tempdir().unwrap();
    unzip(&zip_path, app_dir.path());
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
    let mut extracted: Vec<String> = walk(app_dir.path(), app_dir.path());
    extracted.sort();
    assert_eq!(
        extracted.into_iter().collect::<BTreeSet<_>>(),
        expected_names("tablescan"),
        "the folder holds exactly the app"
    );

    // The host runs the extracted folder as it is (no staging, no tuning of host.json).
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

    // A copy scan through the queue functions: the package's function.json files bind the
    // queues, and the handler writes the copy; checked with the raw REST client.
    let client = RawClient::azurite();
    let source = unique_name("PkgSource");
    let destination = unique_name("PkgDest");
    let entities: Vec<_> = tablescan::lab::dataset::entities(60, 5, Default::default())
        .flatten()
        .collect();
    seed(&app.store, &source, entities).await;
    let (_, end) = app.scan_until_end(&json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 20}), Duration::from_secs(120)).await;
    assert_eq!(end["state"], "completed", "{end}");
    let (source_rows, copied) = (client.rows(&source).await, client.rows(&destination).await);
    assert!(!source_rows.is_empty());
    assert_eq!(copied.len(), source_rows.len());
    assert_eq!(raw::diff(&source_rows, &copied), Vec::<String>::new());
    app.shutdown().await;
}

/// Paths of every file under `dir`, relative to `root`, with `/` separators.
fn walk(root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(root, &path));
        } else {
            let relative = path.strip_prefix(root).unwrap();
            out.push(
                relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/"),
            );
        }
    }
    out
}
