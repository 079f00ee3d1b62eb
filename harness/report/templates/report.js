window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  document.body.dataset.imagesLoaded = String(imgs.filter(function (i) {
    return i.complete && i.naturalWidth > 0; }).length);
  document.body.dataset.imagesTotal = String(imgs.length);
  var widths = Array.prototype.map.call(document.querySelectorAll("table.cells"), function (t) {
    return Math.ceil(t.getBoundingClientRect().width); });
  document.body.dataset.widestModelTable = String(widths.length ? Math.max.apply(null, widths) : 0);
  document.body.dataset.viewportWidth = String(document.documentElement.clientWidth);
  document.body.dataset.modelTablesScrolling = String(Array.prototype.filter.call(
    document.querySelectorAll("div.scroll"), function (d) {
      return d.querySelector("table.cells") && d.scrollWidth > d.clientWidth; }).length);
});
