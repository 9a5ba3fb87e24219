import { render } from 'preact'
import { App } from './app.tsx'
import { startSession } from './session.ts'

/** The dashboard's entry: find the session (taking an OAuth token from the URL first), then render. */
void startSession()
render(<App />, document.getElementById('app')!)
