//! The hostile corpus (`arbiter-hostile`) through the real `arbiter` binary:
//! `arbiter policy check` tells the truth about every case and prints
//! nothing a policy could use to forge a verdict or clear the terminal;
//! `arbiter sim` refuses what cannot work and finishes every run with a
//! policy that faults, with its output bounded.

use arbiter_hostile::{Case, Expect, Role};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_arbiter");

fn write_case(dir: &Path, case: &Case) -> PathBuf {
    let path = dir.join(format!("{}.wasm", case.name));
    std::fs::write(&path, &case.wasm).expect("write case");
    path
}

fn arbiter(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run arbiter")
}

/// Escapes and direction overrides a policy could smuggle into a terminal.
fn forged(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        c == '\u{1b}' || c == '\u{7}' || c == '\r' || ('\u{202a}'..='\u{202e}').contains(&c)
    })
}

fn check_output(case: &Case, out: &Output) -> Result<bool, String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = &case.name;
    if out.stdout.len() + out.stderr.len() > 64 << 10 {
        return Err(format!(
            "{name}: printed {} + {} bytes",
            out.stdout.len(),
            out.stderr.len()
        ));
    }
    if let Some(c) = forged(&stdout).or_else(|| forged(&stderr)) {
        return Err(format!("{name}: printed {c:?} unescaped"));
    }
    let verdicts = stdout
        .lines()
        .filter(|l| l.starts_with('✓') || l.starts_with('✗'))
        .count();
    if verdicts != 1 {
        return Err(format!("{name}: {verdicts} verdict lines:\n{stdout}"));
    }
    let passed = stdout.starts_with('✓');
    if passed != out.status.success() {
        return Err(format!("{name}: verdict and exit status disagree"));
    }
    Ok(passed)
}

/// The deadline a case runs under: 1 s for a case that hangs (it pays it per
/// call), 30 s for every other, so a loaded test machine cannot turn a
/// refusal or fault for what a component is (64 MiB hoarded, a 40 MiB role
/// name, a 24 MiB description) into one for time.
fn deadline_ms(case: &Case) -> &'static str {
    if case.hangs { "1000" } else { "30000" }
}

#[test]
fn policy_check_tells_the_truth_about_every_hostile_component() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for case in arbiter_hostile::corpus() {
        let path = write_case(dir.path(), &case);
        let out = arbiter(&[
            "policy",
            "check",
            "--deadline-ms",
            deadline_ms(&case),
            &path.display().to_string(),
        ]);
        // Modes misbehave only under a slot's configuration: with the
        // default one they are healthy components.
        let must_pass = matches!(
            case.expect,
            Expect::Works | Expect::Faults { .. } | Expect::Flaps { .. }
        );
        match check_output(&case, &out) {
            Ok(passed) if passed == must_pass => {}
            Ok(passed) => failures.push(format!(
                "{}: check {} but must {}:\n{}",
                case.name,
                if passed { "passed" } else { "failed" },
                if must_pass { "pass" } else { "fail" },
                String::from_utf8_lossy(&out.stdout)
            )),
            Err(e) => failures.push(e),
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let said = match &case.expect {
            Expect::Refused(text) => stdout.contains(text),
            Expect::Unusable(_) => stdout.contains("policy"),
            _ => stdout.contains("configured   with its default configuration"),
        };
        if !said {
            failures.push(format!(
                "{}: the report does not say why:\n{stdout}",
                case.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The bombs took 1.4–5.5 GB to compile, and under a 2 GiB data
/// limit the server aborted. Under a 256 MiB one (`prlimit`, util-linux),
/// `policy check` still refuses every bomb with a verdict, not a signal, and
/// still passes a healthy component (so the limit is not what fails them).
#[test]
fn compile_bombs_are_refused_under_a_tight_memory_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check_limited = |path: &Path| {
        Command::new("prlimit")
            .arg(format!("--data={}", 256u64 << 20))
            .arg("--")
            .arg(BIN)
            .args(["policy", "check", &path.display().to_string()])
            .env("NO_COLOR", "1")
            .output()
            .expect("run prlimit (util-linux)")
    };
    let mut failures = Vec::new();
    let mut bombs = 0;
    for case in arbiter_hostile::corpus() {
        let healthy = case.name == "description-escape";
        if !(case.name.starts_with("bomb-") || healthy) {
            continue;
        }
        bombs += usize::from(!healthy);
        let out = check_limited(&write_case(dir.path(), &case));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ok = if healthy {
            out.status.success()
        } else {
            out.status.code() == Some(1)
                && matches!(case.expect, Expect::Refused(why) if stdout.contains(why))
        };
        if !ok {
            failures.push(format!(
                "{}: {:?}\n{stdout}{}",
                case.name,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(bombs >= 5, "the corpus has {bombs} compile bombs");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn sim_refuses_what_cannot_work_and_survives_what_faults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for case in arbiter_hostile::corpus() {
        let scheduler_case = matches!(
            case.expect,
            Expect::Faults {
                role: Role::Scheduler,
                ..
            } | Expect::Flaps {
                role: Role::Scheduler
            } | Expect::Works
        );
        let refused = matches!(case.expect, Expect::Refused(_) | Expect::Unusable(_));
        if !(scheduler_case || refused) {
            continue;
        }
        let path = write_case(dir.path(), &case);
        let mut args = vec![
            "sim".to_string(),
            "--policy".into(),
            path.display().to_string(),
            "--deadline-ms".into(),
            deadline_ms(&case).into(),
        ];
        if let Some(config) = &case.config {
            args.extend(["--config".into(), config.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = arbiter(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let bounded = out.stdout.len() + out.stderr.len() < 256 << 10;
        let clean = forged(&stdout).or_else(|| forged(&stderr)).is_none();
        let ok = if refused {
            !out.status.success()
        } else {
            out.status.success() && stdout.contains("jobs completed   320/320")
        };
        if !(ok && bounded && clean) {
            failures.push(format!(
                "{}: status {}, {} + {} bytes, clean {clean}\n{stdout}\n{}",
                case.name,
                out.status,
                out.stdout.len(),
                out.stderr.len(),
                &stderr[..stderr.len().min(2000)]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
