//! An inline echo server shared by the tests: listens on `port`, sends every received
//! buffer back (through the runtime's backlog), closes on a receive error.

use r2c::{Conn, Ctx, InlineApp};

/// Echo on `port` with a listen backlog of `backlog`.
pub struct Echo {
    pub port: u16,
    pub backlog: usize,
}

impl InlineApp for Echo {
    fn on_start(&mut self, ctx: &mut Ctx<'_>) {
        ctx.listen(self.port, self.backlog)
            .expect("echo port is free");
    }
    fn on_readable(&mut self, ctx: &mut Ctx<'_>, conn: Conn) {
        echo_up_to(ctx, conn, usize::MAX);
    }
}

/// Sends up to `max` received buffers of `conn` back (through the runtime's backlog);
/// closes on a receive error, aborts when the backlog refuses.
#[allow(dead_code)] // not every test that includes this file calls it directly
pub fn echo_up_to(ctx: &mut Ctx<'_>, conn: Conn, max: usize) {
    for _ in 0..max {
        match ctx.recv(conn) {
            Ok(Some(buf)) => {
                if ctx.send_all(conn, buf).is_err() {
                    return ctx.abort(conn);
                }
            }
            Ok(None) => return,
            Err(_) => return ctx.close(conn),
        }
    }
}
