//! `egpu top`: a live terminal view of the node's devices and slices
//! (ratatui + crossterm), refreshed from egpud's gRPC API.
//!
//! Contract: [`render`] is a pure function of a [`Snapshot`], so a frame can
//! be tested with ratatui's `TestBackend` and printed as plain text
//! (`--once`). The live view restores the terminal on every way out: `q`,
//! Esc, Ctrl-C, an error, or a panic.

use crate::output::{self, NodeOut, SliceOut};
use egpu_core::Bytes;
use egpu_node::client::Client;
use egpu_node::proto;
use ratatui::Terminal;
use ratatui::backend::{Backend, CrosstermBackend, TestBackend};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Refresh interval, e.g. 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = interval, allow_negative_numbers = true)]
    pub interval: Duration,
    /// Print one frame as plain text and exit (no raw mode; for scripts).
    #[arg(long)]
    pub once: bool,
    /// Width of the `--once` frame in columns (40 to 1000; a narrower
    /// frame cuts every column to nothing).
    #[arg(long, default_value_t = 120, requires = "once", value_parser = clap::value_parser!(u16).range(40..=1000))]
    pub width: u16,
}

/// What one frame shows.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub node: Option<NodeOut>,
    pub slices: Vec<SliceOut>,
    /// Why the last refresh failed (the frame keeps the previous data).
    pub error: Option<String>,
    pub interval: Duration,
}

impl Snapshot {
    /// Rows the frame needs to show everything without clipping.
    pub fn height(&self) -> u16 {
        let devices = self.node.as_ref().map_or(0, |n| n.devices.len());
        let rows: usize = self.slices.iter().map(|s| s.devices.len().max(1)).sum::<usize>().max(1);
        (1 + (devices.max(1) + 3) + (rows + 3) + 1) as u16
    }
}

pub async fn fetch(c: &mut Client, interval: Duration) -> anyhow::Result<Snapshot> {
    let node = output::node_out(crate::cmd::get_node(c).await?);
    let list = c.list_slices(proto::ListSlicesRequest {}).await.map_err(crate::exit::status)?.into_inner();
    let slices = list.slices.into_iter().map(output::slice_out).collect();
    Ok(Snapshot { node: Some(node), slices, error: None, interval })
}

/// `[#####.....]` for `frac` of `width` cells.
pub fn bar(frac: f64, width: usize) -> String {
    let f = if frac.is_finite() { frac.clamp(0.0, 1.0) } else { 0.0 };
    let full = (f * width as f64).round() as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

fn pct(p: f64) -> String {
    // An empty sum of f64 is -0.0: shown as 0%.
    let p = p + 0.0;
    if p.fract().abs() < 0.05 { format!("{p:.0}%") } else { format!("{p:.1}%") }
}

/// Draws one frame of `s` into `f`.
pub fn render(f: &mut Frame, s: &Snapshot) {
    let devices = s.node.as_ref().map_or(0, |n| n.devices.len());
    let [title, dev_area, slice_area, status] =
        Layout::vertical([Constraint::Length(1), Constraint::Length((devices.max(1) + 3) as u16), Constraint::Min(4), Constraint::Length(1)])
            .areas(f.area());

    let head = match &s.node {
        Some(n) => {
            let kind = if n.simulated { format!("simulated ({})", n.simulate_spec) } else { format!("driver {}", n.driver_version) };
            format!("egpu top - {}, {kind}, {} device(s), {} slice(s), every {}", n.hostname, n.devices.len(), s.slices.len(), humantime::format_duration(s.interval))
        }
        None => "egpu top - waiting for egpud".to_string(),
    };
    f.render_widget(Paragraph::new(Line::from(head).style(Style::new().add_modifier(Modifier::BOLD))), title);

    let bold = Style::new().add_modifier(Modifier::BOLD);
    let dev_rows: Vec<Row> = s
        .node
        .iter()
        .flat_map(|n| n.devices.iter())
        .map(|d| {
            let usage: f64 = s.slices.iter().flat_map(|sl| sl.devices.iter()).filter(|sd| sd.device == d.index).map(|sd| sd.compute_usage_percent).sum();
            Row::new(vec![
                d.index.to_string(),
                d.name.clone(),
                format!("{} {}/{}", bar(d.driver_used_bytes as f64 / d.memory_bytes.max(1) as f64, 10), Bytes(d.driver_used_bytes), Bytes(d.memory_bytes)),
                format!("{}", Bytes(d.allocated_memory_bytes)),
                pct(d.allocated_compute_percent),
                pct(usage),
            ])
        })
        .collect();
    let dev_table = Table::new(
        dev_rows,
        [Constraint::Length(5), Constraint::Min(12), Constraint::Length(32), Constraint::Length(11), Constraint::Length(8), Constraint::Length(8)],
    )
    .header(Row::new(vec!["GPU", "NAME", "MEMORY USED/TOTAL", "ALLOCATED", "SHARES", "BUSY"]).style(bold))
    .block(Block::bordered().title(" devices "));
    f.render_widget(dev_table, dev_area);

    let mut rows = Vec::new();
    for sl in &s.slices {
        let procs = sl.processes.iter().filter(|p| p.alive).count();
        for (i, d) in sl.devices.iter().enumerate() {
            let first = i == 0;
            rows.push(Row::new(vec![
                if first { sl.name.clone() } else { String::new() },
                d.device.to_string(),
                {
                    // A bursting slice's limit now: its guarantee plus what it was lent.
                    let limit = d.memory_limit_bytes.saturating_add(d.memory_granted_bytes);
                    format!("{} {}/{}", bar(d.used_bytes as f64 / limit.max(1) as f64, 10), Bytes(d.used_bytes), Bytes(limit))
                },
                format!("{} {}", bar(d.compute_usage_percent / 100.0, 10), pct(d.compute_usage_percent)),
                format!("{}/{}", pct(d.compute_share_percent), pct(d.compute_limit_percent)),
                format!("{:.1}s", d.compute_throttled_seconds),
                if first { sl.priority.clone() } else { String::new() },
                if first { procs.to_string() } else { String::new() },
            ]));
        }
    }
    let empty = s.slices.is_empty();
    let slice_table = Table::new(
        rows,
        [
            Constraint::Min(10),
            Constraint::Length(3),
            Constraint::Length(32),
            Constraint::Length(19),
            Constraint::Length(11),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(5),
        ],
    )
    .header(Row::new(vec!["SLICE", "GPU", "MEMORY USED/LIMIT", "COMPUTE USED", "SHARE/LIMIT", "THROTTLED", "PRIORITY", "PROCS"]).style(bold))
    .block(Block::bordered().title(if empty { " slices: none (egpu create --name NAME --gpu-memory 4GiB) " } else { " slices " }));
    f.render_widget(slice_table, slice_area);

    let foot = match &s.error {
        Some(e) => format!("error: {e} (showing the last data; retrying)"),
        None => "q, Esc or Ctrl-C quits".to_string(),
    };
    f.render_widget(Paragraph::new(foot), status);
}

/// The frame as text, one line per row, trailing blanks trimmed.
pub fn buffer_text(b: &Buffer) -> String {
    let w = b.area.width as usize;
    let mut out = String::new();
    for row in b.content().chunks(w.max(1)) {
        let line: String = row.iter().map(|c| c.symbol()).collect();
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// One frame of `s` as plain text, `width` columns wide.
pub fn render_text(s: &Snapshot, width: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(width, s.height())).expect("TestBackend never fails");
    t.draw(|f| render(f, s)).expect("TestBackend never fails");
    buffer_text(t.backend().buffer())
}

/// `--interval`: at least 100 ms (a shorter one would keep egpud busy
/// answering).
fn interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s} is too short: give at least 100ms"));
    }
    Ok(d)
}

pub async fn run(socket: &Path, args: TopArgs) -> anyhow::Result<i32> {
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.once && !terminal {
        return Err(crate::exit::Failure::new(
            crate::exit::USAGE,
            "egpu top draws a live view and needs a terminal on stdin and stdout; for scripts and pipes use `egpu top --once` (one plain-text frame) or `egpu ls -o json`",
        )
        .into());
    }
    // Connect first, so an unreachable egpud is a plain error (exit 5), not a blank screen.
    let mut c = crate::cmd::connect(socket).await?;
    let snap = fetch(&mut c, args.interval).await?;
    if args.once {
        crate::output::print(&render_text(&snap, args.width))?;
        return Ok(0);
    }
    let guard = TermGuard::enter()?;
    let result = live(&mut c, snap, args.interval).await;
    drop(guard);
    result.map(|()| 0)
}

/// Raw mode and the alternate screen, undone on drop and on panic.
struct TermGuard;

fn restore() {
    let _ = crossterm::terminal::disable_raw_mode();
    let _ = crossterm::execute!(std::io::stdout(), crossterm::terminal::LeaveAlternateScreen, crossterm::cursor::Show);
}

impl TermGuard {
    fn enter() -> anyhow::Result<TermGuard> {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            hook(info);
        }));
        crossterm::terminal::enable_raw_mode()?;
        let guard = TermGuard;
        crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen, crossterm::cursor::Hide)?;
        Ok(guard)
    }
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        restore();
    }
}

enum Input {
    Quit,
    Redraw,
}

fn is_quit(k: &crossterm::event::KeyEvent) -> bool {
    use crossterm::event::{KeyCode, KeyEventKind, KeyModifiers};
    k.kind != KeyEventKind::Release
        && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)))
}

async fn live(c: &mut Client, mut snap: Snapshot, interval: Duration) -> anyhow::Result<()> {
    let mut term = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    term.clear()?;
    // Keys come from a thread blocked in crossterm's read; it ends with the process.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while let Ok(ev) = crossterm::event::read() {
            let msg = match ev {
                crossterm::event::Event::Key(k) if is_quit(&k) => Input::Quit,
                crossterm::event::Event::Resize(..) => Input::Redraw,
                _ => continue,
            };
            if tx.send(msg).is_err() {
                break;
            }
        }
    });
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        draw(&mut term, &snap)?;
        tokio::select! {
            input = rx.recv() => match input {
                Some(Input::Quit) | None => return Ok(()),
                Some(Input::Redraw) => {}
            },
            _ = tick.tick() => match fetch(c, interval).await {
                Ok(s) => snap = s,
                Err(e) => snap.error = Some(format!("{e:#}")),
            },
        }
    }
}

fn draw<B: Backend>(term: &mut Terminal<B>, snap: &Snapshot) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    term.draw(|f| render(f, snap))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{DeviceOut, ProcessOut, SliceDeviceOut};

    fn slice(name: &str, used: u64, limit: u64, share: f64, cap: f64, usage: f64, procs: usize) -> SliceOut {
        SliceOut {
            id: format!("s-{name}"),
            name: name.into(),
            priority: "high".into(),
            ephemeral: false,
            owner_pid: 0,
            generation: 1,
            created_unix: 0,
            slice_dir: String::new(),
            devices: vec![SliceDeviceOut {
                device: 0,
                uuid: "GPU-0".into(),
                memory_limit_bytes: limit,
                memory_burst_bytes: 0,
                memory_granted_bytes: 0,
                used_bytes: used,
                driver_used_bytes: None,
                untracked_bytes: 0,
                compute_share_percent: share,
                compute_limit_percent: cap,
                refused_allocations: 0,
                compute_usage_percent: usage,
                compute_used_seconds: 1.0,
                compute_throttled_seconds: 2.5,
            }],
            processes: (0..procs).map(|i| ProcessOut { pid: 100 + i as u32, bytes: vec![used], alive: true }).collect(),
        }
    }

    fn snapshot() -> Snapshot {
        let node = NodeOut {
            hostname: "box".into(),
            simulated: true,
            simulate_spec: "1x16GiB".into(),
            driver_version: String::new(),
            agent_version: "0".into(),
            abi_version: 1,
            run_dir: String::new(),
            slice_count: 2,
            devices: vec![DeviceOut {
                index: 0,
                uuid: "GPU-0".into(),
                name: "Sim".into(),
                memory_bytes: 16 << 30,
                sm_count: 80,
                allocated_memory_bytes: 3 << 30,
                lent_memory_bytes: 0,
                free_memory_bytes: 13 << 30,
                allocated_compute_percent: 100.0,
                driver_used_bytes: 1 << 30,
                unmanaged_bytes: None,
                nvlink_group: None,
                pci_bus_id: None,
                numa_node: None,
                pcie_root: None,
                pcie_switch_group: None,
            }],
        };
        Snapshot {
            node: Some(node),
            slices: vec![slice("train", 512 << 20, 1 << 30, 30.0, 30.0, 29.5, 2), slice("infer", 0, 2 << 30, 70.0, 100.0, 70.0, 0)],
            error: None,
            interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn frame_shows_devices_and_slices() {
        let s = snapshot();
        let mut t = Terminal::new(TestBackend::new(120, s.height())).unwrap();
        t.draw(|f| render(f, &s)).unwrap();
        let text = buffer_text(t.backend().buffer());
        let line = |needle: &str| text.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line with {needle:?}:\n{text}")).to_string();
        let train = line("train");
        for want in ["[#####.....] 512MiB/1GiB", "[###.......] 29.5%", "30%/30%", "2.5s", "high", " 2"] {
            assert!(train.contains(want), "train row lacks {want:?}: {train}\n{text}");
        }
        let infer = line("infer");
        for want in ["[..........] 0B/2GiB", "70%/100%", " 0"] {
            assert!(infer.contains(want), "infer row lacks {want:?}: {infer}\n{text}");
        }
        let dev = line("Sim");
        for want in ["1GiB/16GiB", "3GiB", "100%", "99.5%"] {
            assert!(dev.contains(want), "device row lacks {want:?}: {dev}\n{text}");
        }
        assert!(text.contains("2 slice(s)") && text.contains("q, Esc or Ctrl-C quits"), "{text}");
        // render_text is the same frame.
        assert_eq!(render_text(&s, 120), text);
    }

    #[test]
    fn frame_without_slices_or_with_an_error_says_so() {
        let mut s = snapshot();
        s.slices.clear();
        s.error = Some("cannot reach egpud".into());
        let text = render_text(&s, 100);
        assert!(text.contains("slices: none"), "{text}");
        assert!(text.contains("error: cannot reach egpud"), "{text}");
        // A device no slice uses is 0% busy (an empty f64 sum is -0.0).
        let dev = text.lines().find(|l| l.contains("Sim")).unwrap_or_else(|| panic!("{text}"));
        assert!(!dev.contains("-0%") && dev.contains(" 0%"), "{dev}");
    }

    #[test]
    fn bars_clamp() {
        assert_eq!(bar(0.5, 4), "[##..]");
        assert_eq!(bar(2.0, 4), "[####]");
        assert_eq!(bar(f64::NAN, 4), "[....]");
        assert_eq!(bar(-1.0, 2), "[..]");
    }
}
