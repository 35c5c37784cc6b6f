//! `gpuctl top` in a real terminal: tmux, each test on a server of its own, typing with
//! `send-keys` and reading the screen with `capture-pane`, against nvml-sim with real
//! processes and real signals.

use std::process::Command;
use std::time::Duration;

use crate::terminal::Terminal;
use crate::util::{
    GIB, Gpu, PidReuser, Proc, Process, RootOwnedProgram, Scenario, Sim, alive, is_root,
    setpriv_args, wait_exited,
};

/// `gpuctl top ARGS` against `sim`.
fn top_command(sim: &Sim, args: &[&str]) -> Command {
    let mut all = vec!["top"];
    all.extend_from_slice(args);
    sim.gpuctl(&all)
}

/// `gpuctl top ARGS` against `sim` in a terminal of `size`.
fn top(sim: &Sim, args: &[&str], size: (u16, u16)) -> Terminal {
    Terminal::start(&top_command(sim, args), size)
}

/// `gpuctl top` as user and group `uid`, through setpriv.
fn top_as(sim: &Sim, uid: u32, size: (u16, u16)) -> Terminal {
    let args = setpriv_args(uid);
    let wrapper: Vec<&str> = std::iter::once("setpriv")
        .chain(args.iter().map(String::as_str))
        .collect();
    Terminal::start_wrapped(&top_command(sim, &[]), size, &wrapper)
}

/// The process table's rows: the lines after the heading that start with a pid.
fn rows(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .skip_while(|line| !line.contains("COMMAND"))
        .skip(1)
        .filter(|line| {
            line.get(2..)
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|pid| pid.parse::<u32>().is_ok())
        })
        .collect()
}

fn row_pids(screen: &str) -> Vec<u32> {
    rows(screen)
        .iter()
        .filter_map(|line| line[2..].split_whitespace().next()?.parse().ok())
        .collect()
}

fn on_gpus(procs: &[(&Proc, u32)], gpus: usize) -> Scenario {
    procs.iter().fold(
        Scenario::new().gpus(gpus, Gpu::h200()),
        |scenario, (proc, gpu)| {
            scenario.process(Process::new(proc.pid()).on(*gpu).used(2 * GIB).sm(40))
        },
    )
}

#[test]
fn the_screen_shows_every_gpu_and_the_scenarios_processes() {
    let a = Proc::sleeper("python3", &["train.py", "--rank", "0"]);
    let b = Proc::sleeper("python3", &["serve.py"]);
    let c = Proc::sleeper("python3", &["notebook.py"]);
    let sim = Sim::new(&on_gpus(&[(&a, 0), (&b, 1), (&c, 2)], 3));
    let term = top(&sim, &[], (120, 32));
    let screen = term.wait_for("three GPUs and three processes", |s| row_pids(s).len() == 3);
    for gpu in 0..3 {
        assert!(
            screen.contains(&format!("GPU {gpu} ")),
            "GPU {gpu}:\n{screen}"
        );
    }
    assert!(
        screen.contains("driver 550.54.15") || screen.contains("driver "),
        "{screen}"
    );
    assert!(screen.contains("3 GPUs"), "{screen}");
    for (proc, command) in [
        (&a, "python3 train.py --rank 0"),
        (&b, "python3 serve.py"),
        (&c, "python3 notebook.py"),
    ] {
        let row = rows(&screen)
            .into_iter()
            .find(|r| r.contains(&proc.pid().to_string()))
            .unwrap_or_else(|| panic!("no row for {}:\n{screen}", proc.pid()));
        assert!(row.contains(command), "{row}");
        assert!(row.contains("2.0 GiB"), "{row}");
    }
}

#[test]
fn the_filter_narrows_the_rows_to_one_pid() {
    let a = Proc::sleeper("python3", &["a.py"]);
    let b = Proc::sleeper("python3", &["b.py"]);
    let c = Proc::sleeper("python3", &["c.py"]);
    let sim = Sim::new(&on_gpus(&[(&a, 0), (&b, 0), (&c, 1)], 2));
    let term = top(&sim, &[], (120, 32));
    term.wait_for("three rows", |s| row_pids(s).len() == 3);
    term.keys(&["/"]);
    term.type_text(&b.pid().to_string());
    term.keys(&["Enter"]);
    let screen = term.wait_for("only the filtered pid", |s| row_pids(s) == [b.pid()]);
    assert!(screen.contains(&format!("filter: {}", b.pid())), "{screen}");
    // Esc clears it.
    term.keys(&["Escape"]);
    term.wait_for("every row again", |s| row_pids(s).len() == 3);
}

#[test]
fn k_shows_the_plan_n_leaves_the_process_and_y_ends_it() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    let term = top(&sim, &[], (120, 32));
    term.wait_for("the process", |s| row_pids(s) == [job.pid()]);

    term.keys(&["k"]);
    let plan = term.wait_text("end processes: the plan");
    assert!(
        plan.contains("SIGTERM, then SIGKILL after 10s"),
        "the escalation is shown:\n{plan}"
    );
    assert!(
        plan.contains(&format!("end  pid {} ", job.pid())),
        "what would be signalled:\n{plan}"
    );
    term.keys(&["n"]);
    term.wait_text("nothing ended");
    assert!(alive(job.pid()), "n left it running");

    term.keys(&["k"]);
    term.wait_text("end processes: the plan");
    term.keys(&["y"]);
    let done = term.wait_text("of GPU memory back");
    assert!(
        done.contains(&format!("pid {}: ended (SIGTERM)", job.pid())),
        "{done}"
    );
    assert!(done.contains("2.0 GiB of GPU memory back"), "{done}");
    wait_exited(job.pid());
    term.wait_for("its row gone", |s| {
        s.contains("no processes") && row_pids(s).is_empty()
    });
}

/// The plan shown by `k` is what `y` carries out, on the processes shown: a marked row's
/// process that exits and whose pid another process takes before `y` is skipped, never
/// signalled, while the other marked row's process is ended.
#[test]
fn a_process_replaced_between_k_and_y_is_not_the_one_confirmed_and_is_not_signalled() {
    assert!(
        is_root(),
        "this test needs root: it puts a process at a chosen pid (clone3 set_tid; scripts/test \
         runs as root)"
    );
    let mut replaced = Proc::sleeper("python3", &["train.py"]);
    let other = Proc::sleeper("python3", &["eval.py"]);
    let pid = replaced.pid();
    let sim = Sim::new(&on_gpus(&[(&replaced, 0), (&other, 0)], 1));
    let term = top(&sim, &[], (120, 32));
    term.wait_for("both rows", |s| {
        let mut pids = row_pids(s);
        pids.sort_unstable();
        pids.len() == 2
    });
    // Mark both rows (the cursor starts on the first), then ask for the plan.
    term.keys(&["Space", "Space", "k"]);
    let plan = term.wait_text("end processes: the plan");
    for shown in [pid, other.pid()] {
        assert!(
            plan.contains(&format!("end  pid {shown} ")),
            "both are planned:\n{plan}"
        );
    }
    // Between the plan and the yes: the process exits and a newcomer takes its pid (NVML
    // still lists the pid, as a sim keeps listing it).
    replaced.kill();
    let newcomer = PidReuser::spawn(pid, "sleep", "python3")
        .expect("the kernel refused to put a process at a chosen pid (clone3 set_tid)");
    term.keys(&["y"]);
    let done = term.wait_text("not the process you confirmed");
    assert!(
        done.contains(&format!(
            "pid {pid}: skipped: not the process you confirmed"
        )),
        "{done}"
    );
    assert!(
        alive(newcomer.pid),
        "the newcomer at pid {pid} was signalled:\n{done}"
    );
    assert!(
        done.contains(&format!("pid {}: ended (SIGTERM)", other.pid())),
        "the other confirmed process is ended:\n{done}"
    );
    wait_exited(other.pid());
}

/// A row's process replaced by a newcomer with its pid after the screen showed it and before
/// `k`: `k` names the process shown (pid and start time), so the newcomer is neither planned
/// nor signalled, and `y` says why.
#[test]
fn a_process_replaced_before_k_is_not_planned_and_the_newcomer_is_not_signalled() {
    assert!(
        is_root(),
        "this test needs root: it puts a process at a chosen pid (clone3 set_tid; scripts/test \
         runs as root)"
    );
    let mut replaced = Proc::sleeper("python3", &["train.py"]);
    let pid = replaced.pid();
    let sim = Sim::new(&on_gpus(&[(&replaced, 0)], 1));
    // A long interval: the screen keeps showing the first process until `k`.
    let term = top(&sim, &["--interval", "3600"], (120, 32));
    term.wait_for("the row", |s| row_pids(s) == [pid]);
    replaced.kill();
    let newcomer = PidReuser::spawn(pid, "sleep", "python3")
        .expect("the kernel refused to put a process at a chosen pid (clone3 set_tid)");
    term.keys(&["k"]);
    let plan = term.wait_text("end processes: the plan");
    assert!(
        !plan.contains(&format!("end  pid {pid} ")),
        "the newcomer is not planned:\n{plan}"
    );
    term.keys(&["y"]);
    let done = term.wait_text("not the process you confirmed");
    assert!(
        alive(newcomer.pid),
        "the newcomer at pid {pid} was signalled:\n{done}"
    );
    assert!(
        !done.contains("memory back"),
        "nothing was signalled:\n{done}"
    );
}

/// `--gpu GPU/GI` shows that MIG instance only, as `info --gpu` does: not its GPU's other
/// instances, nor their processes.
#[test]
fn gpu_naming_a_mig_instance_shows_only_that_instance() {
    let in_one = Proc::sleeper("python3", &["train.py"]);
    let in_nine = Proc::sleeper("python3", &["serve.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(
                Gpu::h100()
                    .mig("3g.40gb", 1)
                    .mig("1g.10gb", 9)
                    .mig("1g.10gb", 10),
            )
            .gpu(Gpu::h100())
            .process(Process::new(in_one.pid()).instance(1).used(20 * GIB))
            .process(Process::new(in_nine.pid()).instance(9).used(4 * GIB)),
    );
    let term = top(&sim, &["--gpu", "0/9"], (120, 32));
    let screen = term.wait_for("instance 9's process", |s| row_pids(s) == [in_nine.pid()]);
    assert!(screen.contains("GI 9"), "{screen}");
    assert!(
        !screen.contains("GI 1 ") && !screen.contains("GI 10"),
        "only instance 9 of GPU 0:\n{screen}"
    );
    assert!(!screen.contains("GPU 1"), "{screen}");
}

#[test]
fn a_protected_programs_row_cannot_be_ended_and_says_why() {
    assert!(
        is_root(),
        "this test needs root: a root-owned protected program (scripts/test runs as root)"
    );
    let installed = RootOwnedProgram::install("nvidia-persistenced");
    let daemon = Proc::spawn_program_env(installed.path(), "nvidia-persistenced", &[]);
    let sim = Sim::new(&on_gpus(&[(&daemon, 0)], 1));
    let term = top(&sim, &[], (120, 32));
    term.wait_for("the daemon's row", |s| row_pids(s) == [daemon.pid()]);
    term.keys(&["k"]);
    let plan = term.wait_text("end processes: the plan");
    assert!(
        plan.contains(&format!("skip pid {} ", daemon.pid())),
        "{plan}"
    );
    assert!(plan.contains("protected: nvidia-persistenced"), "{plan}");
    assert!(plan.contains("nothing here can be ended"), "{plan}");
    term.keys(&["y"]);
    let after = term.wait_text("skipped: protected: nvidia-persistenced");
    assert!(
        !after.contains("memory back"),
        "nothing was signalled:\n{after}"
    );
    assert!(alive(daemon.pid()));
}

#[test]
fn escape_and_bell_bytes_in_a_command_line_show_escaped() {
    let evil = Proc::sleeper("python3", &["x\x1b]2;pwned\x07y", "\x1b[2J\x1b[31mred"]);
    let sim = Sim::new(&on_gpus(&[(&evil, 0)], 1));
    let term = top(&sim, &[], (160, 32));
    let screen = term.wait_for("the row", |s| row_pids(s) == [evil.pid()]);
    assert!(
        screen.contains(r"x\e]2;pwned\x07y \e[2J\e[31mred"),
        "shown escaped:\n{screen}"
    );
    let raw = term.screen_escaped();
    assert!(!raw.contains("pwned\x07"), "a raw BEL reached the terminal");
    assert_ne!(
        term.display("#{pane_title}"),
        "pwned",
        "the title was changed"
    );
}

#[test]
fn resize_to_80x24_keeps_every_gpu_line() {
    let procs: Vec<Proc> = (0..8)
        .map(|i| Proc::sleeper("python3", &[&format!("rank{i}.py")]))
        .collect();
    let pairs: Vec<(&Proc, u32)> = procs.iter().zip(0..).collect();
    let sim = Sim::new(&on_gpus(&pairs, 8));
    let term = top(&sim, &[], (140, 50));
    term.wait_for("eight rows", |s| row_pids(s).len() == 8);
    term.resize((80, 24));
    let screen = term.wait_for("the 80x24 layout", |s| {
        s.lines().count() <= 24
            && s.lines().all(|l| l.chars().count() <= 80)
            && s.contains("q quit")
    });
    for gpu in 0..8 {
        assert!(
            screen
                .lines()
                .any(|l| l.starts_with(&format!("GPU {gpu} "))),
            "GPU {gpu} lost at 80x24:\n{screen}"
        );
    }
    assert!(!row_pids(&screen).is_empty(), "rows still shown:\n{screen}");
}

#[test]
fn q_and_ctrl_c_restore_the_terminal() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    let term = top(&sim, &[], (100, 30));
    term.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    assert_eq!(term.display("#{alternate_on} #{cursor_flag}"), "1 0");
    term.keys(&["q"]);
    term.wait_text("gpuctl exited 0");
    assert_eq!(
        term.display("#{alternate_on} #{cursor_flag}"),
        "0 1",
        "no alternate screen left behind, cursor visible"
    );
    assert!(alive(job.pid()));
    drop(term);

    // Ctrl-C, which raw mode delivers as a key, the same.
    let term = top(&sim, &[], (100, 30));
    term.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    term.keys(&["C-c"]);
    term.wait_text("gpuctl exited 0");
    assert_eq!(term.display("#{alternate_on} #{cursor_flag}"), "0 1");
}

#[test]
fn sigterm_restores_the_terminal_and_ends_as_sigterm() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    let term = top(&sim, &[], (100, 30));
    term.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    let pid = term.child_pid();
    // SAFETY: kill(2) on a pid this test's terminal started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    term.wait_text("gpuctl exited 143");
    assert_eq!(term.display("#{alternate_on} #{cursor_flag}"), "0 1");
}

#[test]
fn the_view_ends_when_its_terminal_goes_away() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    let term = top(&sim, &[], (100, 30));
    term.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    let pid = term.child_pid();
    let server: i32 = term.display("#{pid}").parse().expect("tmux server pid");
    // The window closes without a word: the terminal's master side is gone at once. The
    // view must end, not spin reading end-of-file from a dead terminal.
    // SAFETY: kill(2) on the tmux server this test started.
    assert_eq!(unsafe { libc::kill(server, libc::SIGKILL) }, 0);
    // Fails with "condition not met" if gpuctl top still runs 10 s later.
    crate::util::wait_exited(pid);
    assert!(
        crate::util::alive(job.pid()),
        "the process on the GPU lives on"
    );
}

#[test]
fn a_gpu_that_stops_answering_shows_so_while_the_rest_updates() {
    let first = Proc::sleeper("python3", &["first.py"]);
    let second = Proc::sleeper("python3", &["second.py"]);
    let scenario = |procs: &[&Proc]| {
        procs.iter().fold(
            Scenario::new()
                .gpu(Gpu::h200())
                .gpu(Gpu::h200().hang(Duration::from_secs(600))),
            |s, p| s.process(Process::new(p.pid()).on(0).used(GIB)),
        )
    };
    let sim = Sim::new(&scenario(&[&first]));
    let term = top(&sim, &["--interval", "0.2"], (120, 32));
    let screen = term.wait_for("GPU 1 not answering", |s| {
        s.lines()
            .any(|l| l.starts_with("GPU 1 ") && l.contains("NOT ANSWERING"))
            && row_pids(s) == [first.pid()]
    });
    assert!(screen.contains("GPU 0 "), "{screen}");
    // The rest keeps updating: a new process on GPU 0 shows up.
    sim.write(&scenario(&[&first, &second]));
    term.wait_for("the new process on the answering GPU", |s| {
        let mut pids = row_pids(s);
        pids.sort();
        let mut want = vec![first.pid(), second.pid()];
        want.sort();
        pids == want && s.contains("NOT ANSWERING")
    });
}

/// SGR parameters that set a color: 30-38 and 90-97 (foreground), 40-48 and 100-107.
fn has_color(escaped: &str) -> bool {
    escaped.split("\x1b[").skip(1).any(|sequence| {
        let Some(params) = sequence.split_once('m').map(|(p, _)| p) else {
            return false;
        };
        params
            .split(';')
            .filter_map(|p| p.parse::<u32>().ok())
            .any(|p| matches!(p, 30..=38 | 40..=48 | 90..=97 | 100..=107))
    })
}

#[test]
fn no_color_and_color_never_draw_without_colors() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    // The control: by default the bars are colored.
    let colored = top(&sim, &[], (100, 30));
    colored.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    assert!(
        has_color(&colored.screen_escaped()),
        "{}",
        colored.screen_escaped()
    );
    drop(colored);
    let plain = Terminal::start(top_command(&sim, &[]).env("NO_COLOR", "1"), (100, 30));
    plain.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    assert!(
        !has_color(&plain.screen_escaped()),
        "{}",
        plain.screen_escaped()
    );
    drop(plain);
    let never = top(&sim, &["--color", "never"], (100, 30));
    never.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    assert!(
        !has_color(&never.screen_escaped()),
        "{}",
        never.screen_escaped()
    );
}

#[test]
fn refused_at_once_without_a_terminal_or_with_an_interval_under_a_tenth() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::h200()));
    let run = sim.run(&["top"]);
    run.assert_one_line_error(2, "top needs a terminal on stdout");
    assert!(run.stderr.contains("gpuctl info --watch"), "{}", run.stderr);
    assert!(run.stdout.is_empty());
    for bad in ["0.05", "0", "-1", "abc"] {
        let run = sim.run(&["top", "--interval", bad]);
        run.assert_one_line_error(2, "--interval");
    }
}

#[test]
fn an_unknown_gpu_is_refused_before_the_screen_is_taken() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::h200()));
    let term = top(&sim, &["--gpu", "7"], (100, 30));
    let screen = term.wait_text("gpuctl exited 2");
    let errors: Vec<&str> = screen
        .lines()
        .filter(|l| l.starts_with("gpuctl:"))
        .collect();
    assert_eq!(errors.len(), 1, "{screen}");
    assert!(errors[0].contains('7'), "{screen}");
    assert_eq!(term.display("#{alternate_on} #{cursor_flag}"), "0 1");
}

#[test]
fn a_user_who_is_not_root_is_told_so_and_cannot_end_roots_process() {
    assert!(
        is_root(),
        "this test needs root: it runs the view as another user (scripts/test runs as root)"
    );
    let job = Proc::sleeper("python3", &["roots-job.py"]);
    let sim = Sim::new(&on_gpus(&[(&job, 0)], 1));
    sim.share();
    let term = top_as(&sim, 65534, (140, 30));
    let screen = term.wait_for("the process", |s| row_pids(s) == [job.pid()]);
    assert!(
        screen.contains("not root: you can end only your own processes"),
        "{screen}"
    );
    term.keys(&["k"]);
    let plan = term.wait_text("end processes: the plan");
    assert!(plan.contains("permission denied"), "{plan}");
    assert!(
        plan.contains("not root: only your own processes can be ended"),
        "{plan}"
    );
    term.keys(&["y"]);
    term.wait_text("skipped: permission denied");
    assert!(alive(job.pid()));
}

#[test]
fn the_watchdogs_findings_are_marked_on_their_rows_and_gpus() {
    let stale = Proc::sleeper("python3", &["crashed-run.py"]);
    let fine = Proc::sleeper("python3", &["healthy.py"]);
    let sim = Sim::new(&on_gpus(&[(&stale, 0), (&fine, 1)], 2));
    let state = sim.dir.path().join("watchdog-state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(
        sim.config_path(),
        format!("[watchdog]\nstate_dir = \"{}\"\n", state.display()),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let findings = serde_json::json!({
        "written_unix": now,
        "interval_s": 5.0,
        "findings": [
            {"kind": "orphaned", "gpus": [0], "uuids": [], "pid": stale.pid(),
             "since_unix": now - 60.0, "reason": "its run crashed"},
            {"kind": "stuck", "gpus": [1], "uuids": [], "pid": null,
             "since_unix": now - 60.0, "reason": "busy, no progress"},
        ],
    });
    std::fs::write(state.join("findings.json"), findings.to_string()).unwrap();
    let term = top(&sim, &[], (120, 32));
    let screen = term.wait_for("both rows", |s| row_pids(s).len() == 2);
    let row_of = |pid: u32| {
        rows(&screen)
            .into_iter()
            .find(|r| r.contains(&format!(" {pid} ")))
            .unwrap_or_else(|| panic!("no row for {pid}:\n{screen}"))
            .to_string()
    };
    assert!(
        row_of(stale.pid()).contains("[stale] python3 crashed-run.py"),
        "{screen}"
    );
    assert!(!row_of(fine.pid()).contains('['), "{screen}");
    let gpu_line = |gpu: u32| {
        screen
            .lines()
            .find(|l| l.starts_with(&format!("GPU {gpu} ")))
            .unwrap()
            .to_string()
    };
    assert!(gpu_line(1).contains("[stuck]"), "{screen}");
    assert!(!gpu_line(0).contains("[stuck]"), "{screen}");
}

#[test]
fn sort_tree_and_totals_keys_change_the_view() {
    let busy = Proc::sleeper("python3", &["busy.py"]);
    let idle = Proc::sleeper("python3", &["idle.py"]);
    // The busy one holds less memory: sorted by memory it is second, by SM first.
    let scenario = Scenario::new()
        .gpu(Gpu::h200())
        .process(Process::new(busy.pid()).used(GIB).sm(90))
        .process(Process::new(idle.pid()).used(4 * GIB).sm(0));
    let sim = Sim::new(&scenario);
    let term = top(&sim, &[], (120, 32));
    term.wait_for("memory order", |s| row_pids(s) == [idle.pid(), busy.pid()]);
    term.keys(&["s"]);
    let screen = term.wait_for("SM order", |s| row_pids(s) == [busy.pid(), idle.pid()]);
    assert!(screen.contains("sort: SM"), "{screen}");
    term.keys(&["t"]);
    term.wait_text("▾ -: 2 processes, 5.0 GiB");
    term.keys(&["u"]);
    let totals = term.wait_text("per-user totals");
    assert!(
        totals
            .lines()
            .any(|l| l.contains("5.0 GiB") && l.contains(" 0 ")),
        "{totals}"
    );
    term.keys(&["Escape"]);
    term.wait_for("the panel closed", |s| !s.contains("per-user totals"));
    term.keys(&["?"]);
    term.wait_text("end the marked processes, or the cursor's");
}

#[test]
fn a_mouse_click_selects_the_row_k_then_ends() {
    let procs: Vec<Proc> = (0..3)
        .map(|i| Proc::sleeper("python3", &[&format!("job{i}.py")]))
        .collect();
    let pairs: Vec<(&Proc, u32)> = procs.iter().map(|p| (p, 0)).collect();
    let sim = Sim::new(&on_gpus(&pairs, 1));
    let term = top(&sim, &[], (120, 32));
    let screen = term.wait_for("three rows", |s| row_pids(s).len() == 3);
    // The last row: not where the cursor starts.
    let target = *row_pids(&screen).last().unwrap();
    let line = screen
        .lines()
        .position(|l| rows(&screen).contains(&l) && l.contains(&format!(" {target} ")))
        .unwrap();
    // A left click as the terminal reports it with SGR mouse mode on (1-based cells).
    let at = format!("{};{}", 5, line + 1);
    term.type_text(&format!("\x1b[<0;{at}M"));
    term.type_text(&format!("\x1b[<0;{at}m"));
    term.keys(&["k"]);
    let plan = term.wait_text("end processes: the plan");
    assert!(plan.contains(&format!("end  pid {target} ")), "{plan}");
    term.keys(&["n"]);
    term.wait_text("nothing ended");
}

#[test]
fn h_shows_the_device_file_holders_nvml_does_not_list() {
    let sim = Sim::new("");
    let dev = sim.dev_dir();
    sim.write(&Scenario::new().device_dir(&dev).gpu(Gpu::new()));
    // A first NVML client makes the sim create its device files.
    let first = sim.run(&["info"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let job = Proc::sleeper("python3", &["listed.py"]);
    let hidden = Proc::spawn_holding(
        "python3",
        &["hidden-infer.py"],
        &[&dev.join("nvidiactl"), &dev.join("nvidia0")],
    );
    sim.write(
        &Scenario::new()
            .device_dir(&dev)
            .gpu(Gpu::new())
            .process(Process::new(job.pid()).used(GIB))
            .process(Process::new(hidden.pid()).used(3 * GIB).unlisted()),
    );
    let term = top(&sim, &[], (120, 32));
    term.wait_for("the listed process", |s| row_pids(s) == [job.pid()]);
    term.keys(&["h"]);
    let panel = term.wait_for("the hidden holder in the panel", |s| {
        s.contains("holders of GPU 0's device file") && s.contains(&hidden.pid().to_string())
    });
    assert!(panel.contains("python3 hidden-infer.py"), "{panel}");
    term.keys(&["h"]);
    term.wait_for("the panel closed", |s| !s.contains("holders of GPU 0"));
}

#[test]
fn mig_instances_have_their_own_lines_and_their_processes_say_which() {
    let a = Proc::sleeper("python3", &["small.py"]);
    let b = Proc::sleeper("python3", &["large.py"]);
    let scenario = Scenario::new()
        .gpu(Gpu::h100().mig("1g.10gb", 9).mig("3g.40gb", 2))
        .process(Process::new(a.pid()).instance(9).used(GIB))
        .process(Process::new(b.pid()).instance(2).used(8 * GIB));
    let sim = Sim::new(&scenario);
    let term = top(&sim, &[], (120, 32));
    let screen = term.wait_for("both processes", |s| row_pids(s).len() == 2);
    assert!(screen.contains("MIG 1g.10gb GI 9"), "{screen}");
    assert!(screen.contains("MIG 3g.40gb GI 2"), "{screen}");
    for (proc, place) in [(&a, "0/9"), (&b, "0/2")] {
        let row = rows(&screen)
            .into_iter()
            .find(|r| r.contains(&format!(" {} ", proc.pid())))
            .unwrap_or_else(|| panic!("no row for {}:\n{screen}", proc.pid()));
        assert!(row.contains(&format!(" {place} ")), "{row}");
    }
}

/// A GPU that needs an action is marked on its line, and the mark goes when it heals.
#[test]
fn a_gpu_that_needs_a_reset_is_marked_until_it_heals() {
    let scenario = |pending: bool| {
        Scenario::new()
            .gpu(Gpu::h200())
            .gpu(Gpu::h200().remapped_rows(0, 1, pending, false))
    };
    let sim = Sim::new(&scenario(true));
    let term = top(&sim, &["--interval", "0.2"], (120, 32));
    let screen = term.wait_for("GPU 1 marked", |s| {
        s.lines()
            .any(|l| l.starts_with("GPU 1 ") && l.contains("[needs a reset]"))
    });
    assert!(
        !screen
            .lines()
            .any(|l| l.starts_with("GPU 0 ") && l.contains("[needs")),
        "{screen}"
    );
    sim.write(&scenario(false));
    term.wait_for("the mark gone", |s| {
        s.lines().any(|l| l.starts_with("GPU 1 ")) && !s.contains("[needs a reset]")
    });
}

/// `top` marks what `clear` would reclaim as `info` does (issue 52): a crashed run's workers
/// show their finding, `orphaned`, in the STATE column; a healthy process its state.
#[test]
fn a_crashed_runs_orphans_show_what_clear_would_reclaim_them_as() {
    use crate::util::TrainingRun;
    let mut run = TrainingRun::start(2, "sleep", "python3", &["train.py", "--model", "llama-8b"]);
    run.crash();
    let workers = run.workers.pids.clone();
    let healthy = Proc::sleeper("python3", &["serve.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpus(2, Gpu::h200())
            .process(Process::new(workers[0]).used(2 * GIB))
            .process(Process::new(workers[1]).used(2 * GIB))
            .process(Process::new(healthy.pid()).on(1).used(GIB)),
    );
    let term = top(&sim, &["--color", "never"], (140, 32));
    let screen = term.wait_for("three processes", |s| row_pids(s).len() == 3);
    let row_of = |pid: u32| {
        rows(&screen)
            .into_iter()
            .find(|r| r[2..].split_whitespace().next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for {pid}:\n{screen}"))
    };
    for &pid in &workers {
        assert!(row_of(pid).contains(" orphaned "), "{}", row_of(pid));
    }
    let healthy_row = row_of(healthy.pid());
    assert!(!healthy_row.contains("orphaned"), "{healthy_row}");
    assert!(healthy_row.contains(" sleeping "), "{healthy_row}");
}
