//! gpuctl's metrics, alert rules and dashboard held to a live Prometheus: three simulated
//! GPU nodes (nvml-sim, real processes of several users, gpuctl-watchdog writing its
//! textfile, Debian's prometheus-node-exporter serving it) scraped by Debian's Prometheus,
//! which loads packaging/prometheus/gpuctl-rules.yml. Prometheus comes from
//! scripts/fetch-prometheus; every test fails with its one-line reason when it cannot.
//!
//! The fleet is started by the first test that needs it and shared by the others (they only
//! read); it is stopped, by PID, before the process exits.
//!
//!     cargo test -p gpuctl-e2e --test prometheus_real

#[path = "../util.rs"]
mod util;

mod api;
mod checks;
mod fleet;
mod gpuctl_fleet;

use std::sync::Mutex;

use libtest_mimic::{Arguments, Failed, Trial};

use fleet::Fleet;

/// None until a test needs the fleet; Err when it could not start (the later tests fail with
/// that reason rather than try again).
static FLEET: Mutex<Option<Result<Fleet, String>>> = Mutex::new(None);

/// The named fleet of `gpuctl fleet`'s tests, started by the first of them.
static GPUCTL_FLEET: Mutex<Option<Result<Fleet, String>>> = Mutex::new(None);

/// Runs `test` on `gpuctl fleet`'s fleet, starting it first if no test has.
fn with_named_fleet(test: fn(&mut Fleet) -> Result<(), String>) -> Result<(), Failed> {
    let mut guard = GPUCTL_FLEET.lock().unwrap_or_else(|e| e.into_inner());
    match guard.get_or_insert_with(|| Fleet::start_with(&gpuctl_fleet::LAYOUT)) {
        Ok(fleet) => test(fleet).map_err(Failed::from),
        Err(e) => Err(e.clone().into()),
    }
}

/// Runs `test` on the fleet, starting it first if no test has.
fn with_fleet(test: fn(&mut Fleet) -> Result<(), String>) -> Result<(), Failed> {
    let mut guard = FLEET.lock().unwrap_or_else(|e| e.into_inner());
    match guard.get_or_insert_with(Fleet::start) {
        Ok(fleet) => test(fleet).map_err(Failed::from),
        Err(e) => Err(e.clone().into()),
    }
}

/// Stops everything; also run if the harness itself panics (the guard's drop).
struct StopOnExit;

impl Drop for StopOnExit {
    fn drop(&mut self) {
        let taken = FLEET.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(taken);
        let taken = GPUCTL_FLEET
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(taken);
    }
}

fn main() {
    let mut args = Arguments::from_args();
    // One thread: the tests share the fleet, and libtest-mimic then runs them on the main
    // thread, the one the daemons' parent-death signal is tied to.
    args.test_threads = Some(1);
    type Test = fn(&mut Fleet) -> Result<(), String>;
    let tests: &[(&str, Test)] = &[
        (
            "every_node_is_scraped_with_the_watchdogs_metrics",
            checks::every_node_is_scraped,
        ),
        (
            "promtool_check_metrics_is_clean_on_every_textfile",
            checks::promtool_check_metrics,
        ),
        (
            "user_memory_sums_to_gpuctl_info_totals",
            checks::user_memory_sums_to_info_totals,
        ),
        (
            "slurm_jobs_named_by_the_environment_are_owners",
            checks::slurm_owners,
        ),
        (
            "a_leak_shows_as_unattributed_on_its_node",
            checks::leak_is_unattributed_on_its_node,
        ),
        (
            "findings_of_every_kind_and_the_interval",
            checks::findings_and_interval,
        ),
        (
            "every_dashboard_expr_returns_series",
            checks::dashboard_exprs,
        ),
        (
            "the_rules_load_and_evaluate",
            checks::rules_load_and_evaluate,
        ),
        (
            "gpu_health_verdicts_xids_remaps_and_ecc",
            checks::health_series,
        ),
    ];
    let mut trials = vec![Trial::test("harness_self_test", || {
        api::self_test();
        checks::self_test();
        Ok(())
    })];
    for &(name, test) in tests {
        trials.push(Trial::test(name, move || with_fleet(test)));
    }
    // In this order: the last two change the fleet (orphans reclaimed, nodes stopped).
    let fleet_tests: &[(&str, Test)] = &[
        (
            "fleet_rows_match_each_nodes_gpuctl_info",
            gpuctl_fleet::rows_match_info,
        ),
        (
            "fleet_by_user_and_owner_across_nodes",
            gpuctl_fleet::by_user_and_owner,
        ),
        ("fleet_detail_runs_info_on_the_node", gpuctl_fleet::detail),
        ("fleet_errors_one_line_and_exit_code", gpuctl_fleet::errors),
        (
            "fleet_exec_reclaims_the_orphans_through_the_template",
            gpuctl_fleet::exec_reclaims_the_orphans,
        ),
        (
            "fleet_lists_stopped_and_stale_nodes_never_clean",
            gpuctl_fleet::silent_nodes_are_listed_as_such,
        ),
    ];
    for &(name, test) in fleet_tests {
        trials.push(Trial::test(name, move || with_named_fleet(test)));
    }
    let stop = StopOnExit;
    let conclusion = libtest_mimic::run(&args, trials);
    drop(stop);
    conclusion.exit();
}
