/**
 * Waiting: a connection in one of the listener's two waiting lists (WaitList): no request of it
 * is being answered, and it has sent nothing the front could act on since `waitingSince`.
 */
export interface Waiting {
  waitPrev: Waiting | null
  waitNext: Waiting | null
  waitList: WaitList | null
  /** performance.now() when it joined its list (the connection opened, or its last answer ended). */
  waitingSince: number
}

/**
 * WaitList: connections in the order they began waiting, oldest first. Each joins at the tail when
 * it begins waiting (at that moment's clock), so the list stays ordered by waitingSince without a
 * sort, and joining, leaving and finding the oldest are O(1): the front sheds the oldest first
 * when it needs room, and a request's start and end cost two pointer updates each.
 */
export class WaitList {
  private first: Waiting | null = null
  private last: Waiting | null = null
  size = 0

  /** oldest: the connection waiting longest (null: none). */
  get oldest(): Waiting | null {
    return this.first
  }

  add(w: Waiting, now: number): void {
    if (w.waitList !== null) w.waitList.remove(w)
    w.waitList = this
    w.waitingSince = now
    w.waitPrev = this.last
    w.waitNext = null
    if (this.last) this.last.waitNext = w
    else this.first = w
    this.last = w
    this.size++
  }

  remove(w: Waiting): void {
    if (w.waitList !== this) return
    if (w.waitPrev) w.waitPrev.waitNext = w.waitNext
    else this.first = w.waitNext
    if (w.waitNext) w.waitNext.waitPrev = w.waitPrev
    else this.last = w.waitPrev
    w.waitPrev = w.waitNext = null
    w.waitList = null
    this.size--
  }
}
