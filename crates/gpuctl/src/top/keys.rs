//! Keys and mouse, following htop's and nvitop's habits, turned into changes of the model
//! or into what the loop must do (read again, prepare a kill, carry it out, quit).

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEventKind,
};

use super::model::{Model, Panel};

/// What the loop does after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    Nothing,
    /// Draw again.
    Redraw,
    /// Read the GPUs again now (a panel that needs other facts opened).
    Refresh,
    /// Prepare a kill of the chosen processes and show its plan.
    PrepareKill,
    /// Carry out the plan shown.
    Confirm,
    /// Drop the plan shown.
    Cancel,
    Quit,
}

/// Where the process table's rows are on the screen, for the mouse.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableArea {
    pub top: u16,
    pub height: u16,
}

/// Lines one PgUp or PgDn moves.
fn page(area: TableArea) -> isize {
    (area.height.max(2) - 1) as isize
}

pub fn handle(model: &mut Model, event: &Event, area: TableArea) -> Action {
    match event {
        Event::Key(key) if key.kind != KeyEventKind::Release => on_key(model, key, area),
        Event::Mouse(mouse) => match mouse.kind {
            MouseEventKind::Down(MouseButton::Left)
                if model.panel == Panel::None
                    && mouse.row >= area.top
                    && mouse.row < area.top + area.height =>
            {
                let line = model.offset + usize::from(mouse.row - area.top);
                if line < model.lines.len() {
                    model.move_to(line);
                }
                Action::Redraw
            }
            MouseEventKind::ScrollDown => {
                model.move_by(3);
                Action::Redraw
            }
            MouseEventKind::ScrollUp => {
                model.move_by(-3);
                Action::Redraw
            }
            _ => Action::Nothing,
        },
        Event::Resize(..) => Action::Redraw,
        _ => Action::Nothing,
    }
}

fn on_key(model: &mut Model, key: &KeyEvent, area: TableArea) -> Action {
    // Esc and the next key arriving together read as Alt and that key (terminals send Alt
    // as an Esc prefix); no key of the view takes Alt, so they are taken as the two keys.
    if key.modifiers.contains(KeyModifiers::ALT)
        && let KeyCode::Char(c) = key.code
    {
        let escape = KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE);
        let first = on_key(model, &escape, area);
        let plain = KeyEvent::new(KeyCode::Char(c), key.modifiers - KeyModifiers::ALT);
        return match on_key(model, &plain, area) {
            Action::Nothing => first,
            then => then,
        };
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c' | 'C')) {
        return Action::Quit;
    }
    if let Panel::Confirm(_) = model.panel {
        return match key.code {
            KeyCode::Char('y' | 'Y') => Action::Confirm,
            KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => Action::Cancel,
            _ => Action::Nothing,
        };
    }
    if model.editing_filter {
        return on_filter_key(model, key);
    }
    if model.panel != Panel::None {
        return on_panel_key(model, key);
    }
    on_table_key(model, key, area)
}

/// A key while the filter is being typed: a character, Backspace, Enter keeps, Esc clears.
fn on_filter_key(model: &mut Model, key: &KeyEvent) -> Action {
    match key.code {
        KeyCode::Esc => {
            model.filter.clear();
            model.editing_filter = false;
        }
        KeyCode::Enter => model.editing_filter = false,
        KeyCode::Backspace => {
            model.filter.pop();
        }
        // Typed text is the user's own, but a pasted control byte is still not drawn.
        KeyCode::Char(c) if !gpuctl_core::text::needs_escape(c) => model.filter.push(c),
        _ => return Action::Nothing,
    }
    model.relayout();
    Action::Redraw
}

/// A key while a panel other than the plan is open: it closes on its own key, Esc or q.
fn on_panel_key(model: &mut Model, key: &KeyEvent) -> Action {
    let closes = matches!(
        (&model.panel, key.code),
        (_, KeyCode::Esc | KeyCode::Char('q'))
            | (Panel::Help, KeyCode::Char('?'))
            | (Panel::Users, KeyCode::Char('u'))
            | (Panel::Holders(_), KeyCode::Char('h'))
    );
    if closes {
        model.panel = Panel::None;
        return Action::Redraw;
    }
    Action::Nothing
}

/// A key on the table itself: moving, marking, sorting, filtering, panels, ending.
fn on_table_key(model: &mut Model, key: &KeyEvent, area: TableArea) -> Action {
    match key.code {
        KeyCode::Char('q') => return Action::Quit,
        KeyCode::Up => model.move_by(-1),
        KeyCode::Down => model.move_by(1),
        KeyCode::PageUp => model.move_by(-page(area)),
        KeyCode::PageDown => model.move_by(page(area)),
        KeyCode::Home => model.move_to(0),
        KeyCode::End => model.move_to(usize::MAX),
        KeyCode::Char(' ') => model.toggle_mark(),
        KeyCode::Char('s') => {
            model.sort = model.sort.next();
            model.relayout();
        }
        KeyCode::Char('/') => model.editing_filter = true,
        KeyCode::Esc => {
            model.filter.clear();
            model.status = None;
            model.relayout();
        }
        KeyCode::Char('g') => model.next_gpu(),
        KeyCode::Char('t') => {
            model.grouped = !model.grouped;
            model.relayout();
        }
        KeyCode::Char('u') => model.panel = Panel::Users,
        KeyCode::Char('h') => {
            let Some(gpu) = model.holder_gpu() else {
                return Action::Nothing;
            };
            model.panel = Panel::Holders(gpu);
            return Action::Refresh;
        }
        KeyCode::Char('?') => model.panel = Panel::Help,
        KeyCode::Char('k') | KeyCode::F(9) => return Action::PrepareKill,
        _ => return Action::Nothing,
    }
    Action::Redraw
}

/// The keys, for the footer (short) and the help panel.
pub const FOOTER: &str = "↑↓ move  Space mark  s sort  / filter  g GPU  t tree  u users  h holders  k end  ? help  q quit";
pub const FOOTER_ASCII: &str = "Up/Dn move  Space mark  s sort  / filter  g GPU  t tree  u users  h holders  k end  ? help  q quit";
/// Under 80 columns.
pub const FOOTER_NARROW: &str =
    "Space mark s sort / filter g GPU t tree u users h holders k end ? help q quit";

pub const HELP: &[(&str, &str)] = &[
    ("Up/Down PgUp/PgDn Home/End", "move the cursor"),
    ("mouse click, wheel", "select a row, scroll"),
    ("Space", "mark or unmark the process"),
    ("s", "sort by memory, SM, age, pid, user"),
    ("/", "filter by pid, user, owner or command (Esc clears)"),
    ("g", "narrow to one GPU, the next, then all"),
    ("t", "group by owner"),
    ("u", "per-user totals"),
    ("h", "device-file holders of the GPU"),
    (
        "k or F9",
        "end the marked processes, or the cursor's: shows the plan first",
    ),
    ("y / n", "carry out the plan / leave everything as it is"),
    ("?", "this help"),
    ("q or Ctrl-C", "quit"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::{KeyEvent, MouseEvent};

    fn key(code: KeyCode) -> Event {
        Event::Key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    #[test]
    fn the_plan_takes_only_y_or_n_and_ctrl_c_always_quits() {
        let mut model = Model::new(true, 0);
        let area = TableArea::default();
        assert_eq!(
            handle(&mut model, &key(KeyCode::Char('k')), area),
            Action::PrepareKill
        );
        assert_eq!(
            handle(&mut model, &key(KeyCode::F(9)), area),
            Action::PrepareKill
        );
        model.panel = Panel::Confirm(vec!["plan".into()]);
        assert_eq!(
            handle(&mut model, &key(KeyCode::Char('k')), area),
            Action::Nothing
        );
        assert_eq!(
            handle(&mut model, &key(KeyCode::Char('y')), area),
            Action::Confirm
        );
        assert_eq!(
            handle(&mut model, &key(KeyCode::Char('n')), area),
            Action::Cancel
        );
        assert_eq!(handle(&mut model, &key(KeyCode::Esc), area), Action::Cancel);
        let ctrl_c = Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert_eq!(handle(&mut model, &ctrl_c, area), Action::Quit);
    }

    #[test]
    fn the_filter_takes_text_q_included_and_esc_clears_it() {
        let mut model = Model::new(true, 0);
        let area = TableArea::default();
        handle(&mut model, &key(KeyCode::Char('/')), area);
        for c in "q1\x1b".chars() {
            handle(&mut model, &key(KeyCode::Char(c)), area);
        }
        assert_eq!(model.filter, "q1", "a control byte is not taken");
        handle(&mut model, &key(KeyCode::Enter), area);
        assert!(!model.editing_filter);
        handle(&mut model, &key(KeyCode::Esc), area);
        assert!(model.filter.is_empty());
        assert_eq!(
            handle(&mut model, &key(KeyCode::Char('q')), area),
            Action::Quit
        );
    }

    #[test]
    fn a_click_outside_the_table_moves_nothing() {
        let mut model = Model::new(true, 0);
        let click = |row| {
            Event::Mouse(MouseEvent {
                kind: MouseEventKind::Down(MouseButton::Left),
                column: 3,
                row,
                modifiers: KeyModifiers::NONE,
            })
        };
        let area = TableArea { top: 10, height: 5 };
        assert_eq!(handle(&mut model, &click(2), area), Action::Nothing);
        assert_eq!(handle(&mut model, &click(11), area), Action::Redraw);
    }
}
