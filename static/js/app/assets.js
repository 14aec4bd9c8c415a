// Versioned asset URLs that the server writes on every page (templates/base.html): after an
// upgrade the URLs change, so a browser never mixes cached old modules or shaders with new ones.

/** Base URL of the WGSL files, e.g. '/shaders/v-1a2b3c4d/'. */
export const SHADER_BASE = document.documentElement.dataset.shaders || '/shaders/';
