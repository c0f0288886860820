//! The demo, the project's main job, end to end on a small table so it cannot rot.

use crate::support;

use std::process::Command;

#[test]
fn demo_copies_backs_up_restores_verifies_and_summarises() {
    let output = Command::new(env!("CARGO_BIN_EXE_tablescan"))
        .args(["demo", "--rows", "400", "--seed", "3"])
        .env(
            "AzureWebJobsStorage",
            support::azurite().connection_string(),
        )
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("curl -X POST http://127.0.0.1:"),
        "{stderr}"
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("verified: Demo"))
            .count(),
        2,
        "both copies verified:\n{stderr}"
    );
    assert!(
        stderr.contains("\"driver\":\"export\"") && stderr.contains("\"driver\":\"import\""),
        "the export and the import are started over HTTP:\n{stderr}"
    );
    assert!(
        stderr.contains("backup: ") && stderr.contains(", 400 rows, "),
        "the manifest is summarised:\n{stderr}"
    );
    assert!(
        stderr.contains("/tablescan-demo/backups/DemoSource"),
        "where the backup is:\n{stderr}"
    );
    assert_eq!(
        stderr.matches("restore verified: DemoRestored").count(),
        1,
        "the restore verified:\n{stderr}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            ["prefix ", "serial ", "export ", "import "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for row in rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields[1], "400", "{row}");
    }
    assert!(stdout.contains("Every copy verified: 400 rows"), "{stdout}");
    assert!(
        stdout.contains("restored into DemoRestored") && stdout.contains("and verified: 400 rows"),
        "{stdout}"
    );
}

#[test]
fn demo_fails_clearly_when_storage_is_unreachable() {
    let output = Command::new(env!("CARGO_BIN_EXE_tablescan"))
        .args(["demo", "--rows", "10"])
        .env(
            "AzureWebJobsStorage",
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;TableEndpoint=http://127.0.0.1:9/devstoreaccount1;QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;",
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: seeding"), "{stderr}");
    assert!(
        !stderr.contains("Eby8vdM02x"),
        "the account key must never be printed: {stderr}"
    );
}
