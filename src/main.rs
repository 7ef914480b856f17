//! This module owns the process entry: make everything the run creates
//! private (umask 077), block signals before any thread exists, parse the
//! configuration, call `run`, and turn the result into the documented exit
//! code (or the exec of the target etcd, with the umask and mask it found).

use std::process::ExitCode;

use etcd_migrate::backup::tool;
use etcd_migrate::config::{self, ConfigError};
use etcd_migrate::exec::{self, ExecError, ExecTarget, Inherited};
use etcd_migrate::{log, run, signal_exit_code, Outcome, EXIT_FAILURE, EXIT_OK, EXIT_PRECONDITION};

fn main() -> ExitCode {
    // Before anything is created: every file and dir that we, or the etcd,
    // etcdctl and etcdutl we start, create from here on is private. The
    // exec'd target gets the user's umask back.
    let umask = exec::make_created_files_private();
    // `etcd-migrate backup list|verify|restore`: the operator's commands,
    // with the default signal dispositions (a restore killed midway is
    // finished or discarded by the next run, as a step's swap is).
    let args: Vec<String> = std::env::args().collect();
    if tool::is_backup_command(&args) {
        log::init(config::log_format_hint(args.iter().cloned()));
        return ExitCode::from(tool::main(&args, &|name| std::env::var(name).ok()));
    }
    // Then, before the async runtime or any helper thread exists: threads
    // inherit the mask, so only the signal thread ever sees these signals.
    let original_mask = match etcd_migrate::supervisor::block_signals() {
        Ok(mask) => mask,
        Err(err) => {
            log::error(&err.to_string(), &[]);
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    log::init(config::log_format_hint(std::env::args()));
    // Test builds only (the `failpoints` feature): reads FAILPOINTS.
    let _failpoints = etcd_migrate::failpoint::setup();
    let config = match config::from_process() {
        Ok(config) => config,
        Err(ConfigError::Cli(err)) if !err.use_stderr() => {
            // --help / --version: clap prints to stdout.
            let _ = err.print();
            return ExitCode::from(EXIT_OK);
        }
        Err(err) => {
            log::error(&err.to_string(), &[]);
            return ExitCode::from(EXIT_PRECONDITION);
        }
    };
    match run(&config, original_mask) {
        Ok(Outcome::Exit) => ExitCode::from(EXIT_OK),
        Ok(Outcome::ExitCode(code)) => ExitCode::from(code),
        Ok(Outcome::Exec(target)) => hand_over(
            target,
            Inherited {
                signal_mask: original_mask,
                umask,
            },
        ),
        Err(err) => {
            log::error(&log::error_chain(&err), &[("exit", err.exit_code().into())]);
            ExitCode::from(err.exit_code())
        }
    }
}

/// Execs the target etcd with what the process inherited given back;
/// returns only when that fails.
fn hand_over(target: ExecTarget, inherited: Inherited) -> ExitCode {
    log::info(
        "exec",
        &[
            ("program", target.program.display().to_string().into()),
            ("args", target.args.join(" ").into()),
        ],
    );
    match target.exec(inherited) {
        ExecError::Interrupted(signal) => {
            log::error(
                &format!("stopped by {signal} before exec; the data dir is migrated"),
                &[],
            );
            ExitCode::from(signal_exit_code(signal))
        }
        err => {
            log::error(&log::error_chain(&err), &[]);
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
