import { LabIcon } from '@jupyterlab/ui-components';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 6h16a2 2 0 0 1 2 2v7a2 2 0 0 1-2 2H9v2H7v-2H5v2H3zm2 2v7h14V8zm2 1.5h4v4H7zm6 0h4v4h-4zM21 10h2v1h-2zm0 2h2v1h-2z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({
  name: 'jupyter-gpu-gov:gpu',
  svgstr: GPU_SVG
});
