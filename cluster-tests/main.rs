//! Cluster tests (issue 11): multi-member etcd clusters of the image under
//! test, one container per member on a private Docker network with its own
//! address, peer and client TLS with certificates made in the test, a
//! client writing throughout, and the invariants checked on every monitor
//! round and at the end. Run with `make cluster-test`, or with
//! `ETCD_MIGRATE_IMAGE=<tag> cargo test --test cluster`; without that
//! variable every scenario prints `cluster tests: NOT RUN` and why.
//!
//! - `harness`: containers, network, certificates, writer, monitor, checks.
//! - `refusals`: the safety floor on a live cluster: a member restarted
//!   with a new target through `migrate-if-needed.sh` (`--no-exec`, which
//!   cannot coordinate a roll) is refused (exit 2) and the cluster keeps
//!   quorum, its writes and its membership; the member then rejoins; the
//!   same for a rollback target on a 3.5 cluster; a new member joining a
//!   3.3 cluster with TARGET_VERSION=3.5.16 on an empty data dir is refused.
//! - `upgrades`: the rolling upgrades the members' entrypoints coordinate
//!   (3.3 → 3.4 → 3.5 with 3 and 5 members, the `examples/ha/` sets as
//!   written, all restarted at once, a member offline through a wave, lock
//!   holders SIGKILLed at each point of their restart, a holder cut off, a
//!   target lowered mid-wave, Kubernetes' own HA manifests one minor up
//!   through `migrate-if-needed.sh`).
//! - `downgrades`: the way back through etcd's downgrade (3.7 → 3.6 →
//!   3.5 and up again, 3 and 5 members, holders killed at each point, a
//!   target raised mid-downgrade, a member offline through a wave, a member
//!   cut off while the downgrade is enabled, an operator's rollout 3 s and
//!   40 s apart that a restart of ours never meets: issue 30).
//! - `restores`: a whole cluster restored from one snapshot by its
//!   members' entrypoints, members that join by themselves, new or after
//!   losing their data, and a cluster that lost its quorum recovered from
//!   one survivor (issue 29).
//! - `restarts`: restarts, kills and cuts at one version (no version
//!   change) keep quorum and every write; the monitor proven to catch a
//!   member run by hand two minors ahead.
//! - `pauses`: targets no roll can reach member by member (etcd2 →
//!   etcd3 with 3 and 5 members, 3.4 → 3.3) reached through one
//!   whole-cluster pause with every member's consent, a job that waits for
//!   a member without it, and members SIGKILLed at each phase of the job
//!   (issue 28).

mod harness;

mod downgrades;
mod pauses;
mod refusals;
mod restarts;
mod restores;
mod upgrades;

use libtest_mimic::{Arguments, Trial};

use crate::harness::{availability, needs_of, say, Availability};

/// Every scenario, named as libtest named it (`make cluster-test
/// TESTS=from_3_5` and CI's failure lists keep working).
macro_rules! scenarios {
    ($($path:path),* $(,)?) => {
        vec![$((stringify!($path).replace(' ', ""), $path as fn())),*]
    };
}

/// The runner: each scenario is asked what it needs (`harness::needs_of`),
/// and one that cannot run here is listed as ignored with its `NOT RUN`
/// line and reason, so the count says what ran: a scenario that did not
/// run is never counted as passed.
fn main() {
    let args = Arguments::from_args();
    let scenarios = scenarios![
        refusals::gce_member_restarted_with_a_new_target_by_migrate_if_needed_is_refused_and_rejoins,
        refusals::kubeadm_member_restarted_one_minor_back_keeps_serving_its_release,
        refusals::kubeadm_member_joining_two_minors_ahead_is_refused,
        refusals::gce_member_joining_two_minors_ahead_is_refused,
        restarts::rolling_restart_of_five_members_at_one_version_keeps_quorum_and_writes,
        restarts::member_killed_then_member_cut_off_rejoin_with_every_write,
        restarts::monitor_catches_a_member_run_by_hand_two_minors_ahead,
        restores::a_whole_cluster_is_restored_from_one_snapshot,
        restores::five_members_gce_style_are_restored_from_one_snapshot,
        restores::members_join_by_themselves_new_and_after_losing_their_data,
        restores::a_cluster_that_lost_its_quorum_is_recovered_from_one_survivor,
        restores::five_members_that_lost_three_are_recovered_from_one_survivor,
        restores::a_whole_3_7_cluster_is_restored_from_one_snapshot,
        restores::members_join_by_themselves_on_3_7,
        restores::a_3_7_cluster_that_lost_its_quorum_is_recovered,
        upgrades::the_kubeadm_example_set_rolls_three_members_from_3_3_to_3_5,
        upgrades::the_gce_example_set_rolls_three_members_from_3_3_to_3_5,
        upgrades::kubernetes_ha_manifests_roll_one_minor_up_through_migrate_if_needed,
        upgrades::five_members_gce_exec_style_roll_from_3_3_to_3_5,
        upgrades::all_members_restarted_at_once_form_the_quorum_then_roll,
        upgrades::a_member_offline_holds_the_wave_until_it_is_back,
        upgrades::lock_holders_killed_at_each_point_of_their_restart_resume_the_roll,
        upgrades::a_holder_cut_off_while_it_restarts_resumes_once_reconnected,
        upgrades::a_target_lowered_during_a_wave_ends_the_roll_at_the_lower_target,
        upgrades::from_2_2::five_members_roll,
        upgrades::from_2_2::all_at_once,
        upgrades::from_2_2::offline_through_a_wave,
        upgrades::from_2_2::holders_killed,
        upgrades::from_2_2::holder_cut_off,
        upgrades::from_2_2::target_lowered,
        upgrades::from_3_0::five_members_roll,
        upgrades::from_3_0::all_at_once,
        upgrades::from_3_0::offline_through_a_wave,
        upgrades::from_3_0::holders_killed,
        upgrades::from_3_0::holder_cut_off,
        upgrades::from_3_0::target_lowered,
        upgrades::from_3_5::five_members_roll,
        upgrades::from_3_5::all_at_once,
        upgrades::from_3_5::offline_through_a_wave,
        upgrades::from_3_5::holders_killed,
        upgrades::from_3_5::holder_cut_off,
        upgrades::from_3_5::target_lowered,
        downgrades::kubeadm_three_members_go_back_from_3_7_to_3_5_and_up_again,
        downgrades::gce_five_members_go_back_from_3_7_to_3_5_and_up_again,
        downgrades::a_member_cut_off_while_the_downgrade_is_enabled_rejoins_the_wave,
        downgrades::downgrade_holders_killed_at_each_point_resume,
        downgrades::a_target_raised_mid_downgrade_cancels_it_and_rolls_forward,
        downgrades::a_member_offline_holds_the_downgrade_until_it_is_back,
        downgrades::a_rollout_3_s_apart_never_meets_a_restart_of_ours,
        downgrades::a_rollout_40_s_apart_never_meets_a_restart_of_ours,
        downgrades::three_members_go_back_from_3_5_to_3_4_45_with_no_job_and_up_again,
        downgrades::a_3_5_to_3_4_45_rollout_3_s_apart_on_five_members,
        downgrades::a_3_5_to_3_4_45_member_killed_at_each_point_carries_on,
        pauses::three_members_etcd2_to_etcd3_with_one_pause,
        pauses::three_members_etcd3_to_etcd2_with_one_pause,
        pauses::three_members_3_4_to_3_3_with_one_pause,
        pauses::three_members_3_5_to_3_3_in_one_rollout,
        pauses::three_members_3_7_to_3_3_in_one_rollout,
        pauses::three_members_3_3_to_3_2_with_one_pause,
        pauses::three_members_3_2_to_3_1_with_one_pause,
        pauses::three_members_2_3_etcd2_to_3_2_etcd3_in_one_rollout,
        pauses::below_3_3_the_leadership_moved_off_the_converter_comes_back,
        pauses::three_members_2_3_etcd2_to_3_5_etcd3_in_one_rollout,
        pauses::a_member_killed_as_its_roll_hands_over_to_the_pause_job,
        pauses::without_consent_on_one_member_the_job_waits,
        pauses::a_member_down_when_the_job_is_due_holds_it,
        pauses::a_job_to_3_0_waits_saying_why,
        pauses::a_key_the_v2_store_cannot_hold_holds_the_job_until_it_goes,
        pauses::a_v2_key_on_a_v3_key_holds_the_job_until_it_goes,
        pauses::a_3_4_job_to_etcd2_waits_for_the_v2_api_then_goes,
        pauses::a_target_raised_before_the_go_cancels_the_job,
        pauses::five_members_gce_style_etcd2_to_etcd3_with_one_pause,
        pauses::the_converter_cut_off_after_it_took_the_data,
        pauses::the_converters_etcd_lost_while_it_serves_is_started_again_by_its_entrypoint,
        pauses::members_killed_at_each_phase_converge::converter_at_the_go_then_a_member_that_left,
        pauses::members_killed_at_each_phase_converge::member_leaving_then_converter_taking_the_data,
        pauses::members_killed_at_each_phase_converge::converter_converted_then_member_added_to_it,
        pauses::members_killed_at_each_phase_converge::converter_serving_then_member_proven,
        pauses::members_killed_at_each_phase_converge::learner_added_then_promoted,
        pauses::members_killed_at_each_phase_converge::to_etcd2_member_added_then_member_proven,
        pauses::below_3_3_killed_at_each_phase_converge::converter_at_the_go_then_taking_the_data,
        pauses::below_3_3_killed_at_each_phase_converge::member_leaving_then_converter_serving,
        pauses::below_3_3_killed_at_each_phase_converge::member_added_then_member_proven,
    ];
    let mut trials: Vec<Trial> = scenarios
        .into_iter()
        .map(|(name, scenario)| {
            let needs = needs_of(scenario);
            let needs: Vec<&str> = needs.iter().map(String::as_str).collect();
            let not_run = match availability(&needs) {
                Availability::NotRun(why) => Some(why),
                Availability::Runs { .. } | Availability::Broken(_) => None,
            };
            let trial = Trial::test(name.clone(), move || {
                scenario();
                Ok(())
            });
            match not_run {
                Some(why) => {
                    // Only for the scenarios this run selects.
                    if args
                        .filter
                        .as_ref()
                        .is_none_or(|f| name.contains(f.as_str()))
                    {
                        say(&format!("NOT RUN: {name}: {why}"));
                    }
                    trial.with_ignored_flag(true)
                }
                None => trial,
            }
        })
        .collect();
    // The harness's own checks: plain tests, no image needed.
    trials.push(Trial::test(
        "harness::monitor::tests::two_down_and_two_minors_ahead_are_violations",
        || {
            crate::harness::monitor::tests::two_down_and_two_minors_ahead_are_violations();
            Ok(())
        },
    ));
    trials.push(Trial::test(
        "harness::monitor::tests::the_longest_span_with_every_member_down_is_measured",
        || {
            crate::harness::monitor::tests::the_longest_span_with_every_member_down_is_measured();
            Ok(())
        },
    ));
    trials.push(Trial::test(
        "harness::writer::tests::longest_pause_runs_from_the_first_failure_to_the_next_ack",
        || {
            crate::harness::writer::tests::longest_pause_runs_from_the_first_failure_to_the_next_ack();
            Ok(())
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
