// Files imported `with { type: 'file' }` resolve to a path that `bun build --compile` embeds.
declare module 'swagger-ui-dist/swagger-ui-bundle.js' {
  const path: string
  export default path
}
declare module 'swagger-ui-dist/swagger-ui.css' {
  const path: string
  export default path
}
declare module '*.sql' {
  const text: string
  export default text
}
declare module '*.yaml' {
  const text: string
  export default text
}
