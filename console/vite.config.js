import { defineConfig } from 'vite'

// The console is served by the daemon at /console/ from assets embedded in
// the binary (embed.go): `make console` rebuilds dist/.
export default defineConfig({
  base: '/console/',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 800,
  },
})
