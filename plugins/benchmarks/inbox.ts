/** InboxTarget is what the Inbox delivers socket events to (a benchmark request, http-stream.ts). */
export interface InboxTarget {
  /** finished: the request has ended; later reads are dropped. */
  readonly finished: boolean
  read(data: Buffer, at: number): void
  hangup(err?: Error): void
  abort(message: string): void
}

/**
 * Inbox decouples timestamping from parsing: a socket callback only stamps the arrival time and
 * queues the bytes; parsing runs once the event loop has delivered the whole batch of ready
 * sockets (setImmediate). When a burst of chunks from many streams arrives at once, a first chunk
 * late in the batch is stamped after a few microseconds of queueing, not after the parsing of
 * every chunk before it. Parsing runs in slices of SLICE events so stamping never waits long.
 * Closes go through the same queue so they never overtake data.
 */
const SLICE = 64

class Inbox {
  // parallel arrays, reused across flushes (no allocation per socket event)
  private readonly conns: InboxTarget[] = []
  private readonly reads: (Buffer | null)[] = []
  private readonly ats: number[] = []
  private readonly errs: (Error | undefined)[] = []
  private scheduled = false
  private head = 0

  data(c: InboxTarget, data: Buffer, at: number): void {
    this.conns.push(c)
    this.reads.push(data)
    this.ats.push(at)
    this.errs.push(undefined)
    this.schedule()
  }

  close(c: InboxTarget, err?: Error): void {
    this.conns.push(c)
    this.reads.push(null)
    this.ats.push(performance.now())
    this.errs.push(err)
    this.schedule()
  }

  private schedule(): void {
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(this.flush)
  }

  private readonly flush = () => {
    this.scheduled = false
    const { conns, reads, ats, errs } = this
    // A bounded slice per turn: between slices the loop polls sockets again, so arrivals keep
    // being stamped while a burst of completions (and the requests they launch) is handled.
    const end = Math.min(conns.length, this.head + SLICE)
    while (this.head < end) {
      const i = this.head++
      const data = reads[i]
      const c = conns[i]!
      try {
        if (c.finished) continue
        if (data === null || data === undefined) c.hangup(errs[i])
        else c.read(data, ats[i]!)
      } catch (err) {
        c.abort(`response handling failed: ${err instanceof Error ? err.message : String(err)}`)
      }
    }
    if (this.head < conns.length) {
      this.schedule()
      return
    }
    this.head = 0
    conns.length = 0
    reads.length = 0
    ats.length = 0
    errs.length = 0
  }
}

export const inbox = new Inbox()
