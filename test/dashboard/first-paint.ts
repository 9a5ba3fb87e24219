/**
 * first-paint.ts measures how fast the dashboard shows on localhost: `npx bun test/dashboard/first-paint.ts`.
 * A gateway (AUTH_MODE=none, two simulated GPUs) serves the page; headless chromium opens it ROUNDS
 * times with an empty cache and ROUNDS times with the assets cached, and reports the median first
 * contentful paint and the median time until the GPU bars are drawn (the auth check, the event
 * stream and the GPU and memory views included), both from navigation start, as the page measures them.
 */
import { startGateway } from '../support/gateway.ts'
import { browserMissing, openBrowser } from './browser.ts'

const ROUNDS = 7

if (browserMissing()) process.exit(0)
const gw = await startGateway({ ports: [18980, 18989] })
const browser = await openBrowser()
try {
  // The first request bundles the client (from source): not part of what a page load costs.
  await (await fetch(`${gw.url}/`)).text()
  await browser.context.addInitScript(() => {
    new MutationObserver((_, observer) => {
      if (!document.querySelector('.gpu')) return
      ;(window as unknown as { gpusAt: number }).gpusAt = performance.now()
      observer.disconnect()
    }).observe(document, { subtree: true, childList: true })
  })
  const measure = async (cold: boolean) => {
    const page = await browser.newPage()
    const cdp = await browser.context.newCDPSession(page)
    await cdp.send('Network.setCacheDisabled', { cacheDisabled: cold })
    await page.goto(`${gw.url}/`)
    await page.locator('.gpu').first().waitFor()
    const figures = await page.evaluate(() => ({
      fcp: performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? Number.NaN,
      gpus: (window as unknown as { gpusAt: number }).gpusAt,
    }))
    await page.close()
    return figures
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
  for (const cold of [true, false]) {
    const runs = []
    for (let i = 0; i < ROUNDS; i++) runs.push(await measure(cold))
    console.log(
      `${cold ? 'empty cache ' : 'cached      '} first contentful paint ${median(runs.map((r) => r.fcp)).toFixed(0)} ms, ` +
        `GPU bars drawn ${median(runs.map((r) => r.gpus)).toFixed(0)} ms (median of ${ROUNDS})`,
    )
  }
} finally {
  await browser.close()
  await gw.stop()
}
